"""Test settings: the demo project's, plus a PostgreSQL alias for the ledger's tests.

``default`` stays SQLite (the embedded default); ``postgres`` is the reference database
(``TEST_POSTGRES_URL``, default ``postgres://postgres@127.0.0.1:5432/postgres``; the
test database, ``TEST_POSTGRES_DB`` or ``test_celery_deadlines``, is created next to it
and dropped afterwards); ``sqlite_file`` is a developer's SQLite, a file with Django's
default options, for the tests whose second process opens the same database.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile

import dj_database_url

from demo_project.settings import *  # noqa: F403
from demo_project.settings import DATABASES, VAR_DIR

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

# A developer's SQLite: a file, with Django's default options (tests/django/
# test_eager_runs.py, whose second process opens the same database). The test database
# is a file of this session's own.
DATABASES["sqlite_file"] = {
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": str(VAR_DIR / "developer.sqlite3"),
    "TEST": {
        "NAME": os.path.join(
            tempfile.gettempdir(),
            f"{os.environ.get('TEST_POSTGRES_DB', 'test_celery_deadlines')}_sqlite_file.sqlite3",
        ),
        "DEPENDENCIES": [],
    },
}
