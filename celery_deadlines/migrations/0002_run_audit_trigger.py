"""The audit trigger: every row a statement inserts or changes in the run table appends a
RunEvent in the same statement, so no transition can escape the history.

PostgreSQL and SQLite are the supported ledger databases (the system check
celery_deadlines.E003 says so for any other).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

COLUMNS = (
    "run_id, at, kind, outcome, status, reason, version, lease_token, owner, "
    "lease_expires_at, detail"
)
VALUES = (
    "NEW.id, NEW.updated_at, NEW.op, 'applied', NEW.status, NEW.reason, NEW.version, "
    "NEW.lease_token, NEW.owner, NEW.lease_expires_at, NEW.op_detail"
)
EVENT_TABLE = "celery_deadlines_runevent"
RUN_TABLE = "celery_deadlines_run"

POSTGRESQL = [
    f"""
    CREATE OR REPLACE FUNCTION celery_deadlines_run_audit() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO {EVENT_TABLE} ({COLUMNS}) VALUES ({VALUES});
        RETURN NULL;
    END
    $$
    """,
    f"""
    CREATE OR REPLACE TRIGGER celery_deadlines_run_audit AFTER INSERT OR UPDATE ON {RUN_TABLE}
    FOR EACH ROW EXECUTE FUNCTION celery_deadlines_run_audit()
    """,
]
POSTGRESQL_REVERSE = [
    f"DROP TRIGGER IF EXISTS celery_deadlines_run_audit ON {RUN_TABLE}",
    "DROP FUNCTION IF EXISTS celery_deadlines_run_audit()",
]
SQLITE = [
    f"""
    CREATE TRIGGER IF NOT EXISTS celery_deadlines_run_audit_{when.lower()}
    AFTER {when} ON {RUN_TABLE} FOR EACH ROW BEGIN
        INSERT INTO {EVENT_TABLE} ({COLUMNS}) VALUES ({VALUES});
    END
    """
    for when in ("INSERT", "UPDATE")
]
SQLITE_REVERSE = [
    f"DROP TRIGGER IF EXISTS celery_deadlines_run_audit_{when}" for when in ("insert", "update")
]


def _run(statements: dict[str, list[str]], schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    for statement in statements.get(vendor, []):
        schema_editor.execute(statement)


def create(apps: Any, schema_editor: Any) -> None:
    _run({"postgresql": POSTGRESQL, "sqlite": SQLITE}, schema_editor)


def drop(apps: Any, schema_editor: Any) -> None:
    _run({"postgresql": POSTGRESQL_REVERSE, "sqlite": SQLITE_REVERSE}, schema_editor)


class Migration(migrations.Migration):
    dependencies = [("celery_deadlines", "0001_initial")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
