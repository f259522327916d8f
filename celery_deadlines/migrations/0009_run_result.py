"""``Run.result``: a success's return value, encoded with the task's result serializer,
written by the run's completion (bounded: see ``ledger.results``). Nullable, so that
adding the columns does not rebuild the table under its audit triggers on SQLite; older
runs read NULL (no result kept)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("celery_deadlines", "0008_run_queue"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="result",
            field=models.BinaryField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="result_content_type",
            field=models.CharField(blank=True, max_length=128, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="result_encoding",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
    ]
