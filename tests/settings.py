"""Test settings: the demo project's, plus a PostgreSQL alias for the ledger's tests.

``default`` stays SQLite (the embedded default); ``postgres`` is the reference database
(``TEST_POSTGRES_URL``, default ``postgres://postgres@127.0.0.1:5432/postgres``; the
test database, ``TEST_POSTGRES_DB`` or ``test_celery_deadlines``, is created next to it
and dropped afterwards).
"""

from __future__ import annotations

import importlib.util
import os

import dj_database_url

from demo_project.settings import *  # noqa: F403
from demo_project.settings import DATABASES

if importlib.util.find_spec("django_celery_beat") is not None:
    # (not in the matrix: django-celery-beat does not support its newest Django yet)
    INSTALLED_APPS = [*INSTALLED_APPS, "django_celery_beat"]  # noqa: F405

DATABASES["postgres"] = dj_database_url.parse(
    os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
    conn_max_age=0,
)
# two suites (or a suite and a benchmark) on one machine each name their own
DATABASES["postgres"]["TEST"] = {
    "NAME": os.environ.get("TEST_POSTGRES_DB", "test_celery_deadlines"),
    "DEPENDENCIES": [],
}
