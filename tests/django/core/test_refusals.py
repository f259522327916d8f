"""A gate's refusal is reported by what it did to the run in the ledger: once per run,
at WARNING, when it ended it; a late delivery of a run that had ended at INFO; and a
worker whose clock runs ahead of the ledger's says so, at ERROR once per run. The
ledger's own statements on SQLite; Celery's strategy and request as a worker's main
process runs them (tests/support/main_process.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_deadlines import DEADLINE_HEADER, deadline_refused
from celery_deadlines.ledger.reconcile import reconcile_once
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.models import Run
from celery_deadlines.rules.records import NewRun
from celery_deadlines.rules.wire import encode
from celery_deadlines.testing import FakeClock, use_clock
from tests.support.main_process import MainProcess, celery_headers
from tests.support.unit_tasks import make_task

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("reports", broker="memory://", backend="cache+memory://")
    app.conf.update(deadlines_ledger=True, deadlines_database="default")
    yield app
    app.close()


@pytest.fixture
def refused() -> Iterator[list[Any]]:
    seen: list[Any] = []

    def count(decision: Any, **_: Any) -> None:
        seen.append(decision)

    deadline_refused.connect(count, weak=False)
    yield seen
    deadline_refused.disconnect(count)


def record(store: Store, task_id: str, deadline_in: float) -> None:
    deadline = store.database_now() + timedelta(seconds=deadline_in)
    store.outbox.enqueue(NewRun(task_id=task_id, task_name="shop.reported", deadline=deadline))


def lines(caplog: pytest.LogCaptureFixture, task_id: str) -> list[tuple[str, str]]:
    return [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == "celery_deadlines" and f"[{task_id}]" in r.getMessage()
    ]


def test_a_late_delivery_of_a_run_the_sweeper_expired_is_not_its_refusal_again(
    app: Celery, caplog: pytest.LogCaptureFixture, refused: list[Any]
) -> None:
    store = Store("default")
    record(store, "charge-late", deadline_in=600)
    past = store.database_now() - timedelta(seconds=1)
    Run.objects.filter(task_id="charge-late").update(deadline=past, op="age")
    with caplog.at_level(logging.INFO, logger="celery_deadlines"):
        reconcile_once(app, store)  # the sweeper expires it, tells its caller, logs it
        main = MainProcess(app, make_task(app, "shop.reported"))
        headers = celery_headers(
            app, "shop.reported", "charge-late", **{DEADLINE_HEADER: encode(past)}
        )
        delivery = main.deliver(headers)  # its message, late
    assert delivery.acks == 1
    assert main.pool.handed == []  # never run
    assert lines(caplog, "charge-late") == [
        (
            "WARNING",
            "shop.reported[charge-late] EXPIRED (deadline_passed): the deadline passed before "
            "any worker claimed the run",
        ),
        (
            "INFO",
            "shop.reported[charge-late]: message discarded at claim gate: the run had already "
            "ended EXPIRED (deadline_passed)",
        ),
    ]
    assert refused == []  # the run was counted once, when the sweeper expired it


def test_a_worker_whose_clock_runs_ahead_says_so_at_error_once_per_run_and_ends_nothing(
    app: Celery, caplog: pytest.LogCaptureFixture, refused: list[Any]
) -> None:
    store = Store("default")
    record(store, "charge-ahead", deadline_in=60)
    deadline = Run.objects.get(task_id="charge-ahead").deadline
    assert deadline is not None
    main = MainProcess(app, make_task(app, "shop.reported"))
    headers = celery_headers(
        app, "shop.reported", "charge-ahead", **{DEADLINE_HEADER: encode(deadline)}
    )
    ahead = FakeClock(deadline + timedelta(seconds=35))  # this worker's clock: 95 s ahead
    with use_clock(ahead), caplog.at_level(logging.INFO, logger="celery_deadlines"):
        for _ in range(3):  # the ledger publishes it again, and again
            assert main.deliver(headers).acks == 1
    assert main.pool.handed == []
    assert Run.objects.get(task_id="charge-ahead").status == "QUEUED"  # still in time: not ended
    assert app.AsyncResult("charge-ahead").state == "PENDING"  # the caller is told nothing
    said = lines(caplog, "charge-ahead")
    assert [level for level, _ in said] == ["ERROR", "INFO", "INFO"]
    error = said[0][1]
    assert "this worker's clock runs 9" in error  # about 95 s: the round trip's instants
    assert " s left before its deadline" in error
    assert "deadlines_republish_after (60.0 s)" in error
    assert "deadlines_clock_skew_budget" in error
    assert refused == []
