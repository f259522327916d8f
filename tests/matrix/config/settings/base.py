"""Settings shared by production and local, shaped like cookiecutter-django's
``config/settings/base.py``: the database from ``DATABASE_URL`` with ``ATOMIC_REQUESTS``,
and its Celery block as the template generates it (JSON, ``result_extended``, app-wide
time limits of 5 minutes hard and 1 minute soft, task events). What differs is said
where it is: the library's app and middleware, and a reconciler every half second so
that a run past its deadline ends within a scenario of a few seconds.

Each matrix row sets ``MATRIX_SETTINGS``: a JSON object of settings put over the
module's own (production's or local's) last of all (:func:`row_settings`)."""

from __future__ import annotations

import json
import os
from typing import Any

import dj_database_url

SECRET_KEY = "matrix-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "celery_deadlines",
    "tests.matrix.orders",
]
MIDDLEWARE = [
    "django.middleware.common.CommonMiddleware",
    "celery_deadlines.middleware.DeadlineMiddleware",
]
ROOT_URLCONF = "tests.matrix.config.urls"

# cookiecutter-django: DATABASES = {"default": env.db("DATABASE_URL")}, ATOMIC_REQUESTS on
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    )
}
DATABASES["default"]["ATOMIC_REQUESTS"] = True
# the test database pytest-django creates (a worker is handed its name in DATABASE_URL)
DATABASES["default"]["TEST"] = {
    "NAME": os.environ.get("TEST_POSTGRES_DB", "test_celery_deadlines_matrix")
}

# Celery: cookiecutter-django's block
CELERY_TIMEZONE = TIME_ZONE
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", CELERY_BROKER_URL)
CELERY_RESULT_EXTENDED = True
CELERY_RESULT_BACKEND_ALWAYS_RETRY = True
CELERY_RESULT_BACKEND_MAX_RETRIES = 10
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_TIME_LIMIT = 5 * 60
CELERY_TASK_SOFT_TIME_LIMIT = 60
CELERY_WORKER_SEND_TASK_EVENTS = True
CELERY_TASK_SEND_SENT_EVENT = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("MATRIX_QUEUE", "celery")

# the library: a sweeper every half second (10 s by default), so that a run past its
# deadline is ended within the scenario
CELERY_DEADLINES_RECONCILE_INTERVAL = 0.5


def row_settings(namespace: dict[str, Any]) -> None:
    """Put the row's settings (``MATRIX_SETTINGS``, a JSON object) over ``namespace``'s;
    ``DATABASES__default__KEY`` sets one key of the default alias."""
    for name, value in json.loads(os.environ.get("MATRIX_SETTINGS") or "{}").items():
        if name.startswith("DATABASES__"):
            _, alias, key = name.split("__", 2)
            namespace["DATABASES"][alias][key] = value
        else:
            namespace[name] = value
