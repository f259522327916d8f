"""Django settings of the database cap's workers: the ledger's (PostgreSQL, kept open
between tasks: ``CONN_MAX_AGE``) and a SQLite alias ``local`` (``TEST_SQLITE_PATH``)."""

from __future__ import annotations

import os

from tests.support.ledger_settings import *  # noqa: F403
from tests.support.ledger_settings import DATABASES

DATABASES = {
    **DATABASES,
    "local": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("TEST_SQLITE_PATH", ":memory:"),
    },
}
