"""What the console says of a run (issue 32):

* ``Effect.settled_by``: who settled the effect's last dispatch (an operator in the
  admin, or a worker's reconciler), written with the settlement and cleared by the next
  dispatch. The effect's audit trigger records it as the event's owner, so the run's
  history credits an operator's resolution to the operator, not to the worker whose
  lease it was. The trigger is replaced on both databases (as migration 0004 made it,
  but for the owner).
* ``Run.traceback``: the traceback of the exception a failed run's body raised,
  bounded (``rules.outcomes.TRACEBACK_LIMIT``), written with the run's end.

Both nullable with no default, so SQLite adds them in place (no table rebuild under the
audit triggers); older rows read NULL.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

EVENT_TABLE = "celery_deadlines_runevent"
RUN_TABLE = "celery_deadlines_run"
EFFECT_TABLE = "celery_deadlines_effect"
COLUMNS = (
    "run_id, at, kind, outcome, status, reason, version, lease_token, owner, "
    "lease_expires_at, detail"
)


def select(owner: str) -> str:
    return (
        "SELECT NEW.run_id, NEW.updated_at, 'effect_' || lower(NEW.state), 'applied', "
        f"r.status, r.reason, r.version, NEW.lease_token, {owner}, r.lease_expires_at, "
        f"NEW.key FROM {RUN_TABLE} r WHERE r.id = NEW.run_id"
    )


def postgresql(owner: str) -> list[str]:
    return [
        f"""
        CREATE OR REPLACE FUNCTION celery_deadlines_effect_audit() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'INSERT' OR NEW.state IS DISTINCT FROM OLD.state
               OR NEW.lease_token IS DISTINCT FROM OLD.lease_token THEN
                INSERT INTO {EVENT_TABLE} ({COLUMNS}) {select(owner)};
            END IF;
            RETURN NULL;
        END
        $$
        """
    ]


def sqlite(owner: str) -> list[str]:
    return [
        "DROP TRIGGER IF EXISTS celery_deadlines_effect_audit_insert",
        "DROP TRIGGER IF EXISTS celery_deadlines_effect_audit_update",
        f"""
        CREATE TRIGGER celery_deadlines_effect_audit_insert AFTER INSERT ON {EFFECT_TABLE}
        FOR EACH ROW BEGIN
            INSERT INTO {EVENT_TABLE} ({COLUMNS}) {select(owner)};
        END
        """,
        f"""
        CREATE TRIGGER celery_deadlines_effect_audit_update AFTER UPDATE ON {EFFECT_TABLE}
        FOR EACH ROW WHEN NEW.state IS NOT OLD.state OR NEW.lease_token IS NOT OLD.lease_token
        BEGIN
            INSERT INTO {EVENT_TABLE} ({COLUMNS}) {select(owner)};
        END
        """,
    ]


#: The event's owner: who settled the dispatch, if someone did since it was made; else
#: the run's owner (the attempt that acted).
SETTLER = "COALESCE(NEW.settled_by, r.owner)"
#: Migration 0004's.
RUN_OWNER = "r.owner"


def _trigger(owner: str) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        vendor = schema_editor.connection.vendor
        statements = {"postgresql": postgresql, "sqlite": sqlite}.get(vendor)
        for statement in statements(owner) if statements else []:
            schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("celery_deadlines", "0010_console_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="effect",
            name="settled_by",
            field=models.CharField(
                blank=True,
                help_text="Who settled the last dispatch (an operator, a reconciler).",
                max_length=255,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="run",
            name="traceback",
            field=models.TextField(
                blank=True, help_text="A failed body's traceback, bounded.", null=True
            ),
        ),
        migrations.RunPython(_trigger(SETTLER), _trigger(RUN_OWNER), elidable=False),
    ]
