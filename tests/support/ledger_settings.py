"""Django settings of the ledger worker subprocesses: the run ledger on PostgreSQL."""

from __future__ import annotations

import os

import dj_database_url

SECRET_KEY = "tests-only"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["celery_deadlines"]
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"  # the app pins its own
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get(
            "TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test_celery_deadlines"
        ),
        conn_max_age=60,
    )
}
