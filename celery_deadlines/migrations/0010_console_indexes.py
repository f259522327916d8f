"""The operator's console at a million runs (docs/howto/admin.md):
every list page, filter, search and date drill-down reaches the rows through an index.

* ``cdl_run_created_idx`` (``created_at``): the list's order (newest first), the date
  hierarchy and the date filter; a period is found with one index probe, and a page of
  any period is read in order, never by sorting the period's runs.
* ``cdl_run_task_name_idx``, ``cdl_run_queue_idx`` (the name or queue, then
  ``created_at``): a filter's choices by a loose index scan, and a filtered page read
  newest first from the index, however common or rare the value.
* ``cdl_run_reason_idx`` (``reason``, ``created_at``; partial: only runs that have a
  reason, so a run that succeeds never enters it): the same for the reason filter.
* ``cdl_run_task_id_uniq`` is rebuilt on PostgreSQL with ``varchar_pattern_ops``: the
  same uniqueness (``ON CONFLICT (task_id)`` infers it), and a search by the start of a
  task id (the short id the list shows) reads its range of the index whatever the
  database's collation. It replaces the index, so a run's writes maintain no more than
  before. SQLite keeps its constraint as it is (its text order is the bytes').
* ``cdl_effect_name_idx``, ``cdl_effect_kind_idx``: the effect list's filters.

Each index is built on the whole table, under its lock, while this migration runs:
seconds per million runs (bench/README.md).
"""

from typing import Any

from django.db import migrations, models

RUN_TABLE = "celery_deadlines_run"

#: The unique index rebuilt with the pattern operator class, then put in the old
#: constraint's place under its name (one transaction: never a moment without it).
PATTERN_UNIQUE = [
    f"CREATE UNIQUE INDEX cdl_run_task_id_uniq_new ON {RUN_TABLE} (task_id varchar_pattern_ops)",
    f"ALTER TABLE {RUN_TABLE} DROP CONSTRAINT cdl_run_task_id_uniq",
    "ALTER INDEX cdl_run_task_id_uniq_new RENAME TO cdl_run_task_id_uniq",
]
PLAIN_UNIQUE = [
    "ALTER INDEX cdl_run_task_id_uniq RENAME TO cdl_run_task_id_uniq_old",
    f"ALTER TABLE {RUN_TABLE} ADD CONSTRAINT cdl_run_task_id_uniq UNIQUE (task_id)",
    "DROP INDEX cdl_run_task_id_uniq_old",
]


def _on_postgresql(statements: list[str]) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            for statement in statements:
                schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("celery_deadlines", "0009_run_result"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["created_at"], name="cdl_run_created_idx"),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["task_name", "created_at"], name="cdl_run_task_name_idx"),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["queue", "created_at"], name="cdl_run_queue_idx"),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=~models.Q(reason=""),
                fields=["reason", "created_at"],
                name="cdl_run_reason_idx",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="run", name="cdl_run_task_id_uniq"),
                migrations.AddConstraint(
                    model_name="run",
                    constraint=models.UniqueConstraint(
                        fields=["task_id"],
                        name="cdl_run_task_id_uniq",
                        opclasses=["varchar_pattern_ops"],
                    ),
                ),
            ],
            database_operations=[
                migrations.RunPython(
                    _on_postgresql(PATTERN_UNIQUE), _on_postgresql(PLAIN_UNIQUE), elidable=False
                ),
            ],
        ),
        migrations.AddIndex(
            model_name="effect",
            index=models.Index(fields=["name", "id"], name="cdl_effect_name_idx"),
        ),
        migrations.AddIndex(
            model_name="effect",
            index=models.Index(fields=["kind", "id"], name="cdl_effect_kind_idx"),
        ),
    ]
