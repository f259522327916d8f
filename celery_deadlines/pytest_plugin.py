"""The pytest plugin for users' test suites: a DeadlineTask runs there as a plain task does.

Opt in from the suite's root ``conftest.py`` (it is not loaded by itself)::

    pytest_plugins = ["celery.contrib.pytest", "celery_deadlines.pytest_plugin"]

With the Django app installed, every test then runs DeadlineTasks against a fresh
in-memory run ledger (:class:`~celery_deadlines.testing.FakeLedger`), which keeps the
database ledger's rules (one claim per run and token, effects at most once per key)
and touches no database:

* eagerly (``task_always_eager``, ``apply()``) the body runs with a claimed attempt:
  ``self.effect(...)``, ``self.lease`` and checkpoints work, as on the database's
  ledger, with no database;
* under ``celery.contrib.pytest``'s ``celery_worker`` (a worker thread in the test's
  process), ``delay()`` works with or without pytest-django's ``django_db`` mark: the
  database's ledger would write the run in the test's transaction, which the worker's
  own connection cannot see (and which Celery's Django fixup closes when the worker
  starts, celery/celery#4511).

The fixture ``deadlines_ledger`` is that ledger, to assert on (``.run(task_id)``,
``.effects``). A test marked ``@pytest.mark.deadlines_database_ledger`` runs against
the database's ledger instead (with ``django_db(transaction=True)``, so that a worker
sees the rows it commits). Without the Django app nothing is installed unless a test
asks for ``deadlines_ledger``: production records no runs then either.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery.signals import task_postrun

from . import ledger
from .testing import FakeLedger, use_ledger

#: The marker of a test that runs against the database's ledger.
DATABASE_LEDGER = "deadlines_database_ledger"


#: The receiver of ``task_postrun``, connected while the plugin is loaded.
_RECEIVER = "celery_deadlines.pytest_plugin.close_the_workers_connection"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{DATABASE_LEDGER}: run this test's DeadlineTasks against the database's run "
        "ledger, not the in-memory one (celery_deadlines.pytest_plugin)",
    )
    task_postrun.connect(close_the_workers_connection, weak=False, dispatch_uid=_RECEIVER)


def pytest_unconfigure(config: pytest.Config) -> None:
    task_postrun.disconnect(dispatch_uid=_RECEIVER)


def close_the_workers_connection(sender: Any = None, **_: Any) -> None:
    """After each task a worker thread of the test's process ran (``celery_worker``)
    against the database's ledger, close that thread's dedicated ledger connection. A
    real worker keeps it open across tasks; this worker's thread stops without a worker
    signal in it, and the connection it left open would keep the test database from
    being dropped (PostgreSQL: "being accessed by other users")."""
    app = getattr(sender, "app", None)
    if app is None or getattr(sender.request, "is_eager", False) or not ledger.enabled_for(app):
        return
    if isinstance(ledger.api_for(app), FakeLedger):
        return  # the in-memory ledger: no connection
    from .ledger import api

    api.store_for(app, dedicated=True).close()


def _wants_the_database(request: pytest.FixtureRequest) -> bool:
    return request.node.get_closest_marker(DATABASE_LEDGER) is not None


@pytest.fixture(autouse=True)
def _deadlines_in_memory(request: pytest.FixtureRequest) -> Iterator[FakeLedger | None]:
    """A fresh in-memory ledger for the test, when production would record its runs (the
    Django app installed) and the test does not ask for the database's. Set up before
    any worker fixture and torn down after it: the worker's last claim finds it."""
    if _wants_the_database(request) or not ledger.active():
        yield None
        return
    with use_ledger(FakeLedger()) as fake:
        yield fake


@pytest.fixture
def deadlines_ledger(
    request: pytest.FixtureRequest, _deadlines_in_memory: FakeLedger | None
) -> Iterator[FakeLedger]:
    """The in-memory ledger this test's DeadlineTasks run against (installed for it even
    without the Django app, since the test asks for it)."""
    if _deadlines_in_memory is not None:
        yield _deadlines_in_memory
        return
    if _wants_the_database(request):
        raise pytest.UsageError(
            f"{request.node.nodeid} is marked {DATABASE_LEDGER}: its DeadlineTasks run "
            "against the database's ledger, so it has no deadlines_ledger (read the "
            "celery_deadlines models instead)"
        )
    with use_ledger(FakeLedger()) as fake:
        yield fake
