"""Django settings of the database cap's workers on Django's connection pool: the
ledger's PostgreSQL alias with ``"pool"`` (psycopg 3's pool) of one connection, so that
every task of a worker process borrows the same one (a pool refuses ``CONN_MAX_AGE``:
each task gives its connection back when Celery's Django fixup closes it)."""

from __future__ import annotations

from tests.support.database_settings import *  # noqa: F403
from tests.support.database_settings import DATABASES

DATABASES = {
    **DATABASES,
    "default": {
        **DATABASES["default"],
        "CONN_MAX_AGE": 0,
        "OPTIONS": {
            **DATABASES["default"].get("OPTIONS", {}),
            "pool": {"min_size": 1, "max_size": 1},
        },
    },
}
