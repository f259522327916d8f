"""The bakery's settings: PostgreSQL, the run ledger, Celery eager in tests (as many
projects set it)."""

import os

import dj_database_url

SECRET_KEY = "bakery"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "celery_deadlines",
    "bakery",
]
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    )
}
DATABASES["default"]["TEST"] = {"NAME": os.environ.get("BAKERY_TEST_DATABASE", "test_bakery")}

CELERY_BROKER_URL = "memory://"
CELERY_TASK_ALWAYS_EAGER = True
