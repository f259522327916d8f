"""One word per situation (docs/explanation/run-ledger.md, "Statuses and reasons").

A run whose deadline passed before any worker claimed it was ``expired_before_claim``
when the sweeper found it and ``deadline_passed`` when a worker's claim gate did; it is
``deadline_passed`` now, whoever finds it (``delivery_expired`` for a delivery task's
run, which the new ``delivery_task`` column tells). Existing rows and their events are
renamed so that the admin, ``explain`` and the metrics read one vocabulary; each renamed
run gets one audit event (``op = 'migrate'``) saying so. Rows written before this
migration do not know whether they were a delivery task's: they read
``deadline_passed``.
"""

from typing import Any

from django.db import migrations, models
from django.db.models.functions import Now

OLD = "expired_before_claim"
NEW = "deadline_passed"


def rename_reason(apps: Any, schema_editor: Any) -> None:
    alias = schema_editor.connection.alias
    run = apps.get_model("celery_deadlines", "Run")
    event = apps.get_model("celery_deadlines", "RunEvent")
    # events first: the run's update below appends its own (audit trigger)
    event.objects.using(alias).filter(reason=OLD).update(reason=NEW)
    event.objects.using(alias).filter(detail=OLD).update(detail=NEW)
    run.objects.using(alias).filter(reason=OLD).update(
        reason=NEW,
        op="migrate",
        op_detail=f"reason {OLD} renamed {NEW} (migration 0006)",
        updated_at=Now(),
    )


def keep_new_reason(apps: Any, schema_editor: Any) -> None:
    """Reversing keeps ``deadline_passed``: it is also what a worker's gate wrote."""


class Migration(migrations.Migration):
    dependencies = [
        ("celery_deadlines", "0005_clock_hold_plans_and_schedules"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="delivery_task",
            field=models.BooleanField(blank=True, null=True),
        ),
        migrations.RunPython(rename_reason, keep_new_reason),
    ]
