"""The worker's claim, :func:`celery_deadlines.ledger.api.claim_run`, on each database.

It keeps what it reads from the app's settings (the ledger's store, the lost-lease
limit, the clock-skew budget) until their stamp changes: a value set at run time
(``app.conf.deadlines_x = ...``) or a reload is read by the next claim, as it was
before anything was kept. A run with no row (published by name, or before the app was
installed) is recorded from the message and claimed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from celery import Celery

from celery_deadlines.ledger import api
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.rules.records import Held, NewRun
from celery_deadlines.testing import FakeClock, use_clock

TTL = timedelta(seconds=30)


@pytest.fixture
def app(alias: str) -> Iterator[Celery]:
    app = Celery(f"claim-settings-{uuid.uuid4().hex[:6]}", broker="memory://")
    app.conf.update(deadlines_ledger=True, deadlines_database=alias)
    yield app
    app.close()


def claim(
    app: Celery, alias: str, *, recorded: bool = True, task_id: str = ""
) -> api.Attempt | api.ClaimRefused | Held:
    task_id = task_id or f"run-{uuid.uuid4().hex[:8]}"
    if recorded:
        Store(alias).outbox.enqueue(NewRun(task_id=task_id, task_name="shop.charge"))
    return api.claim_run(
        app,
        task_id=task_id,
        task_name="shop.charge",
        retries=0,
        hostname="w1@host",
        ttl=TTL,
        reserve=timedelta(0),
        unrecorded=lambda: NewRun(task_id=task_id, task_name="shop.charge"),
    )


def test_a_claim_holds_its_run_by_a_clock_skew_budget_set_after_the_last_claim(
    app: Celery, alias: str
) -> None:
    # a fake clock years after the ledger's: any skew budget finds the clocks apart
    with use_clock(FakeClock()):
        before = claim(app, alias)
        app.conf.deadlines_clock_skew_budget = 60
        held = claim(app, alias)
        app.conf.deadlines_clock_skew_budget = None
        after = claim(app, alias)
    assert (type(before), type(held), type(after)) == (api.Attempt, Held, api.Attempt)


def test_a_claim_reads_a_lost_lease_limit_changed_at_run_time(app: Celery, alias: str) -> None:
    app.conf.deadlines_max_lost_leases = 4
    claim(app, alias)
    assert api._claiming(app).max_lost_leases == 4
    app.conf.deadlines_max_lost_leases = 2
    assert api._claiming(app).max_lost_leases == 2


def test_a_claim_of_a_run_with_no_row_records_it_from_the_message_and_wins(
    app: Celery, alias: str
) -> None:
    attempt = claim(app, alias, recorded=False, task_id="by-name-1")
    assert isinstance(attempt, api.Attempt)
    assert (attempt.lease.task_id, attempt.lease.token, attempt.lease.attempt) == (
        "by-name-1",
        1,
        1,
    )
    again = claim(app, alias, recorded=False, task_id="by-name-1")
    assert isinstance(again, api.ClaimRefused)
    assert again.why == api.ClaimRefused.HELD
