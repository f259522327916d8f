"""The effect audit trigger: every change of an effect appends a RunEvent to its run's
history (kind ``effect_<state>``, detail = the effect key), in the same statement."""

from __future__ import annotations

from typing import Any

from django.db import migrations

EVENT_TABLE = "celery_deadlines_runevent"
RUN_TABLE = "celery_deadlines_run"
EFFECT_TABLE = "celery_deadlines_effect"
COLUMNS = (
    "run_id, at, kind, outcome, status, reason, version, lease_token, owner, "
    "lease_expires_at, detail"
)
SELECT = (
    "SELECT NEW.run_id, NEW.updated_at, 'effect_' || lower(NEW.state), 'applied', r.status, "
    "r.reason, r.version, NEW.lease_token, r.owner, r.lease_expires_at, NEW.key "
    f"FROM {RUN_TABLE} r WHERE r.id = NEW.run_id"
)

POSTGRESQL = [
    f"""
    CREATE OR REPLACE FUNCTION celery_deadlines_effect_audit() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'INSERT' OR NEW.state IS DISTINCT FROM OLD.state
           OR NEW.lease_token IS DISTINCT FROM OLD.lease_token THEN
            INSERT INTO {EVENT_TABLE} ({COLUMNS}) {SELECT};
        END IF;
        RETURN NULL;
    END
    $$
    """,
    f"""
    CREATE OR REPLACE TRIGGER celery_deadlines_effect_audit AFTER INSERT OR UPDATE ON {EFFECT_TABLE}
    FOR EACH ROW EXECUTE FUNCTION celery_deadlines_effect_audit()
    """,
]
POSTGRESQL_REVERSE = [
    f"DROP TRIGGER IF EXISTS celery_deadlines_effect_audit ON {EFFECT_TABLE}",
    "DROP FUNCTION IF EXISTS celery_deadlines_effect_audit()",
]
SQLITE = [
    f"""
    CREATE TRIGGER IF NOT EXISTS celery_deadlines_effect_audit_insert AFTER INSERT ON {EFFECT_TABLE}
    FOR EACH ROW BEGIN
        INSERT INTO {EVENT_TABLE} ({COLUMNS}) {SELECT};
    END
    """,
    f"""
    CREATE TRIGGER IF NOT EXISTS celery_deadlines_effect_audit_update AFTER UPDATE ON {EFFECT_TABLE}
    FOR EACH ROW WHEN NEW.state IS NOT OLD.state OR NEW.lease_token IS NOT OLD.lease_token
    BEGIN
        INSERT INTO {EVENT_TABLE} ({COLUMNS}) {SELECT};
    END
    """,
]
SQLITE_REVERSE = [
    f"DROP TRIGGER IF EXISTS celery_deadlines_effect_audit_{when}" for when in ("insert", "update")
]


def _run(statements: dict[str, list[str]], schema_editor: Any) -> None:
    for statement in statements.get(schema_editor.connection.vendor, []):
        schema_editor.execute(statement)


def create(apps: Any, schema_editor: Any) -> None:
    _run({"postgresql": POSTGRESQL, "sqlite": SQLITE}, schema_editor)


def drop(apps: Any, schema_editor: Any) -> None:
    _run({"postgresql": POSTGRESQL_REVERSE, "sqlite": SQLITE_REVERSE}, schema_editor)


class Migration(migrations.Migration):
    dependencies = [("celery_deadlines", "0003_effect")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
