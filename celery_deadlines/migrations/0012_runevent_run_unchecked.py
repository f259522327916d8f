"""An event's run is no longer a checked reference on PostgreSQL (issue 33, item 3).

Every event is written with its run's id read by the same statement, and runs are
deleted after their events (Django's cascade, which the model keeps, and the purge,
children first). The audit triggers write the event of the run row being written; the
statements that write a rejected event from a row read in their snapshot (a lost claim,
a stale write, a refused dispatch) keep that row to their commit with the lock the check
took (``{run_kept}``), so a purge meanwhile waits or they find the run gone. The check
cost every transition a lookup of the run at commit, and locked the run's row for every
event: the won claims, completions and the producer's rows pay neither now.

SQLite keeps its constraint: dropping it there means rebuilding the event table, which
SQLite refuses while the run table's audit triggers name it (a later migration that
rebuilds that table on SQLite meets the same refusal, and would drop the constraint
there), and an in-process check costs it no lock to write.
"""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models

EVENT_TABLE = "celery_deadlines_runevent"
RUN_TABLE = "celery_deadlines_run"
#: The name Django gave the constraint is a hash; it is found by what it is.
DROP = f"""
DO $$
DECLARE name text;
BEGIN
    FOR name IN
        SELECT conname FROM pg_constraint
        WHERE conrelid = '{EVENT_TABLE}'::regclass AND contype = 'f'
          AND confrelid = '{RUN_TABLE}'::regclass
    LOOP
        EXECUTE format('ALTER TABLE {EVENT_TABLE} DROP CONSTRAINT %I', name);
    END LOOP;
END
$$
"""
RESTORE = f"""
ALTER TABLE {EVENT_TABLE} ADD CONSTRAINT {EVENT_TABLE}_run_id_fk
    FOREIGN KEY (run_id) REFERENCES {RUN_TABLE} (id) DEFERRABLE INITIALLY DEFERRED
"""


def _on_postgresql(statement: str) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(statement, params=None)  # no placeholders: %I is format()'s

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("celery_deadlines", "0011_effect_settled_by_run_traceback"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="runevent",
                    name="run",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="events",
                        to="celery_deadlines.run",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunPython(_on_postgresql(DROP), _on_postgresql(RESTORE), elidable=False),
            ],
        ),
    ]
