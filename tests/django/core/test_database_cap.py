"""The database cap where a body runs in the caller's transaction (an eager run under
``ATOMIC_REQUESTS``), on PostgreSQL: the setting is the transaction's (``SET LOCAL``),
and the caller's own statements after the body, in the same transaction, read the
session's defaults again. Run by Celery's own tracer in this thread, on this thread's
connection, inside a transaction the test holds open."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from django.db import connections, transaction

from celery_deadlines import DeadlineTask, QueryCut
from tests.support.memory_queue import drain
from tests.support.trace import execute_next

pytestmark = pytest.mark.django_db(transaction=True, databases=["postgres"])

QUEUE = "db-cap"
ALIAS = "postgres"


class Reports:
    """An app on the ledger of PostgreSQL with two bodies: quick queries, and a slow one
    the body cuts inside its own ``atomic()`` and catches."""

    def __init__(self) -> None:
        self.app = app = Celery("db-cap", broker="memory://", backend="cache+memory://")
        app.conf.update(task_default_queue=QUEUE, deadlines_ledger=True, deadlines_database=ALIAS)

        @app.task(base=DeadlineTask, bind=True, name="reports.quick", shared=False)
        def quick(task: DeadlineTask) -> str:
            with connections[ALIAS].cursor() as cursor:
                cursor.execute("SELECT 1")
                cursor.execute("SHOW statement_timeout")
                return str(cursor.fetchone()[0])

        @app.task(base=DeadlineTask, bind=True, name="reports.slow", shared=False)
        def slow(task: DeadlineTask) -> str:
            try:
                with transaction.atomic(using=ALIAS), connections[ALIAS].cursor() as cursor:
                    cursor.execute("SELECT pg_sleep(10)")
            except QueryCut as cut:
                return cut.detail
            return "not cut"

        self.quick, self.slow = quick, slow


@pytest.fixture
def reports() -> Iterator[Reports]:
    from celery_deadlines.ledger import api

    made = Reports()
    drain(made.app, QUEUE)
    yield made
    drain(made.app, QUEUE)
    made.app.close()
    for store in api._stores.values():  # the claim's own connections (tests/django/conftest.py)
        store.close()


def show(setting: str) -> Any:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(f"SHOW {setting}")
        return cursor.fetchone()[0]


def test_a_body_in_the_callers_transaction_is_capped_there_and_the_caller_reads_the_defaults_after(
    reports: Reports,
) -> None:
    defaults = (show("statement_timeout"), show("lock_timeout"))
    reports.quick.apply_async(budget=30)
    with transaction.atomic(using=ALIAS):
        show("statement_timeout")  # the caller's transaction is open on the server
        state, inside = execute_next(reports.app, QUEUE)
        assert state == "SUCCESS"
        assert inside.endswith("ms"), inside  # the body's own setting, in the transaction
        assert 27_000 <= int(inside.removesuffix("ms")) <= 29_000, inside
        assert (show("statement_timeout"), show("lock_timeout")) == defaults
    assert (show("statement_timeout"), show("lock_timeout")) == defaults


def test_a_query_the_body_catches_in_its_own_atomic_leaves_the_callers_transaction_usable(
    reports: Reports,
) -> None:
    defaults = (show("statement_timeout"), show("lock_timeout"))
    reports.slow.apply_async(budget=1.5)
    with transaction.atomic(using=ALIAS):
        show("statement_timeout")
        state, detail = execute_next(reports.app, QUEUE)
        assert state == "SUCCESS"
        assert "the query 'SELECT pg_sleep(10)' on database 'postgres' was cut" in detail
        assert (show("statement_timeout"), show("lock_timeout")) == defaults
