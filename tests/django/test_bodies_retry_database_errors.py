"""A body whose own database work meets a cut retries through the retry gate, and its
completed effects are replayed, not performed again (issue 31, item 2).

The recipe of docs/howto/database-outage.md ("Ride out a database outage"): Celery's
``autoretry_for`` with Django's connection errors. The library's own writes wait out a cut
themselves; a write inside the body's own ``transaction.atomic()`` cannot be tried again by the
library, so the body is: its next attempt replays the payment from the effect ledger
and publishes the notice again (the outbox finds the row if its commit had landed).
Run by Celery's own tracer on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from django.db import InterfaceError, OperationalError, transaction

from celery_deadlines import DeadlineRefused, DeadlineTask
from celery_deadlines.ledger import patience
from celery_deadlines.ledger.sql.outbox import Outbox
from celery_deadlines.models import Effect, Run
from tests.support.memory_queue import drain
from tests.support.trace import execute_next

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgres"])

QUEUE = "db-retries"
CUT = "consuming input failed: server closed the connection unexpectedly"

#: the recipe's options (docs/howto/database-outage.md)
RIDES_OUT_A_CUT: dict[str, Any] = {
    "autoretry_for": (OperationalError, InterfaceError),
    "retry_backoff": True,
    "retry_backoff_max": 8,
    "max_retries": None,
}


class Shop:
    """An app on the ledger of ``alias`` whose ``order`` pays once, then publishes its
    notice inside its own transaction; ``provider`` is every payment the provider took."""

    def __init__(self, alias: str, **options: Any) -> None:
        self.app = app = Celery(
            f"db-retries-{alias}", broker="memory://", backend="cache+memory://"
        )
        app.conf.update(task_default_queue=QUEUE, deadlines_ledger=True, deadlines_database=alias)
        self.provider: list[str] = []

        @app.task(base=DeadlineTask, bind=True, name="shop.notice", shared=False)
        def notice(task: DeadlineTask, order_id: str) -> str:
            return f"notified {order_id}"

        @app.task(base=DeadlineTask, bind=True, name="shop.order", shared=False, **options)
        def order(task: DeadlineTask, order_id: str) -> Any:
            with task.effect("pay", key=f"{order_id}:pay", fingerprint={"order": order_id}) as fx:
                if not fx.completed:
                    self.provider.append(order_id)
                    fx.succeed({"paid": order_id})
            with transaction.atomic(using=alias):
                notice.apply_async((order_id,), task_id=f"{order_id}.notice")
            return fx.result

        self.order = order


@pytest.fixture
def shop(alias: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Shop]:
    monkeypatch.setattr(patience, "RETRY_INTERVAL", 0)
    made = Shop(alias, budget=600, **RIDES_OUT_A_CUT)
    drain(made.app, QUEUE)
    yield made
    drain(made.app, QUEUE)
    made.app.close()


def cut_the_notice_row(
    monkeypatch: pytest.MonkeyPatch, *, committed: bool, times: int = 1
) -> list[str]:
    """The notice's outbox row, written in the body's own transaction, loses the
    connection ``times`` times: before the database, or with its answer lost."""
    real = Outbox.enqueue
    cuts: list[str] = []

    def enqueue(self: Outbox, run: Any) -> bool:
        if run.task_name == "shop.notice" and len(cuts) < times:
            cuts.append(run.task_id)
            if committed:
                real(self, run)
            raise OperationalError(CUT)
        return bool(real(self, run))

    monkeypatch.setattr(Outbox, "enqueue", enqueue)
    return cuts


def run_of(alias: str, task_id: str) -> Run:
    return Run.objects.using(alias).get(task_id=task_id)


@pytest.mark.parametrize("committed", [False, True], ids=["cut-before", "answer-lost"])
def test_an_order_whose_own_transaction_meets_a_cut_after_paying_retries_and_replays_the_payment(
    alias: str, shop: Shop, monkeypatch: pytest.MonkeyPatch, committed: bool
) -> None:
    shop.order.apply_async(("o-1",), task_id="o-1")
    cuts = cut_the_notice_row(monkeypatch, committed=committed)
    state, _ = execute_next(shop.app, QUEUE)
    assert (state, cuts, shop.provider) == ("RETRY", ["o-1.notice"], ["o-1"])
    assert run_of(alias, "o-1").status == "RETRYING"
    assert execute_next(shop.app, QUEUE) == ("SUCCESS", {"paid": "o-1"})
    assert shop.provider == ["o-1"]  # replayed from the effect ledger, not paid again
    pay = Effect.objects.using(alias).get(key="o-1:pay")
    assert (pay.state, pay.dispatches) == ("SUCCEEDED", 1)
    order = run_of(alias, "o-1")
    assert (order.status, order.retries) == ("SUCCEEDED", 1)
    # the notice is recorded once, published by the retried attempt's commit (or, when
    # the first commit had landed and its answer was lost, by the sweeper)
    assert run_of(alias, "o-1.notice").status == "QUEUED"
    assert shop.app.AsyncResult("o-1").result == {"paid": "o-1"}


def test_an_order_whose_database_stays_away_past_what_its_deadline_allows_fails_naming_its_payment(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry gate decides: a backoff (and an attempt) that cannot fit the time left
    ends the run EXPIRED ``retry_budget_exhausted`` with the database's error, and the
    caller's error names the payment that was made. An attempt takes the whole budget,
    so no retry fits whatever the backoff's jitter draws (0 or 1 s: with a 599 s attempt
    a draw of 0 fitted, and the test passed half the time)."""
    monkeypatch.setattr(patience, "RETRY_INTERVAL", 0)
    shop = Shop(alias, budget=600, attempt_timeout=600, **RIDES_OUT_A_CUT)
    drain(shop.app, QUEUE)
    shop.order.apply_async(("o-2",), task_id="o-2")
    cut_the_notice_row(monkeypatch, committed=False)
    state, raised = execute_next(shop.app, QUEUE)
    assert (state, type(raised), raised.reason) == (
        "FAILURE", DeadlineRefused, "retry_budget_exhausted",
    )  # fmt: skip
    order = run_of(alias, "o-2")
    assert (order.status, order.reason) == ("EXPIRED", "retry_budget_exhausted")
    assert "last error OperationalError" in order.detail
    assert "effects performed before this error: pay (o-2:pay)" in order.detail
    assert shop.provider == ["o-2"]
    shop.app.close()
