"""``Run.queue``: the queue Celery routed a run's message to when it was first published,
for the admin's queue filter. Nullable, so that adding it does not rebuild the table
under its audit triggers on SQLite; older runs read NULL (not known)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("celery_deadlines", "0007_retention"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="queue",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
    ]
