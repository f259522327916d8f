"""Fixtures for tests that run task bodies on the ledger (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import service_unavailable
from tests.support.processes import reachable


@pytest.fixture(params=["default", "postgres"], ids=["sqlite", "postgresql"])
def alias(request: pytest.FixtureRequest) -> Iterator[str]:
    """The database alias the ledger runs on (each test runs on both). The workers'
    stores keep connections of their own: they are closed afterwards, or the test
    database could not be dropped at the end of the session."""
    from celery_deadlines.ledger import api

    if request.param == "postgres" and not reachable("127.0.0.1", 5432):
        service_unavailable("PostgreSQL 127.0.0.1:5432")
    yield str(request.param)
    for store in api._stores.values():
        store.close()
