"""Fixtures for tests that run task bodies on the ledger (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import service_unavailable
from tests.support.processes import reachable


def one_database(alias: str, name: str) -> Any:
    """The parameter ``alias`` of a test that uses that database alone: it may query only
    that one, and only that one is flushed after it (``transaction=True`` flushes every
    database a test names; a flush of the PostgreSQL test database is the costly part
    of most of these tests)."""
    marks = pytest.mark.django_db(transaction=True, databases=[alias])
    return pytest.param(alias, id=name, marks=marks)


#: The ledger's databases: each test runs on each, one at a time.
DATABASES = [one_database("default", "sqlite"), one_database("postgres", "postgresql")]


@pytest.fixture(params=DATABASES)
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


@pytest.fixture(scope="session")
def json_support_known(django_db_setup: None, django_db_blocker: Any) -> None:
    """Every database alias's answer to "do you support JSONField?", asked once. Django
    6.1's ``check`` asks every alias (5.2 none unless ``--database``), a query on SQLite,
    and a test that may not query that alias would fail on the question, not on its
    subject. A test of the system checks uses this fixture."""
    from django.db import connections

    with django_db_blocker.unblock():
        for alias in connections:
            assert connections[alias].features.supports_json_field is not None
