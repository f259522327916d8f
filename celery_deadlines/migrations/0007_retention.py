"""Retention (docs/howto/retention.md).

* ``Effect.asked_at``: when an attempt last found the key recorded (its outcome
  replayed, or its intent found again). The purge keeps an effect, and its run, while
  this is within the retention. Nullable with no default, so SQLite adds the column in
  place (no table rebuild under the effect's audit triggers).
* ``cdl_run_ended_idx``: a partial index of ended runs by their last write, the purge's
  batches in order without a scan of the run table. Only a run's last write enters it.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("celery_deadlines", "0006_run_delivery_task"),
    ]

    operations = [
        migrations.AddField(
            model_name="effect",
            name="asked_at",
            field=models.DateTimeField(
                blank=True,
                help_text="Database clock: the last attempt that found the key.",
                null=True,
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("status__in", ["SUCCEEDED", "FAILED", "EXPIRED"])),
                fields=["updated_at"],
                name="cdl_run_ended_idx",
            ),
        ),
    ]
