"""The permission of the admin's "Cancel with everything it started": a cancel
reaches every run a run started, so it is an operator's right of its own, beside expiring
and requeueing one run. Options only: no table changes."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("celery_deadlines", "0012_runevent_run_unchecked"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="run",
            options={
                "permissions": [
                    ("expire_run", "Can expire an unfinished run"),
                    ("requeue_run", "Can requeue a run whose deadline allows it"),
                    ("cancel_run", "Can cancel a run with everything it started"),
                ]
            },
        ),
    ]
