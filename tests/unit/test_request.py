"""The worker's main process (``DeadlineRequest``), on a fake clock: the claim gate and the
time-limit cap, before a message reaches the pool."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery import Celery

from celery_deadlines import DEADLINE_HEADER
from celery_deadlines.gates import Decision
from celery_deadlines.testing import FakeClock
from celery_deadlines.wire import encode
from tests.support.unit_tasks import claim, make_task, stored_refusal


def test_claim_refuses_an_expired_message_acks_it_and_stores_why(
    app: Celery, clock: FakeClock, refusals: list[Decision]
) -> None:
    task = make_task(app)
    request, on_ack = claim(
        app, task, {DEADLINE_HEADER: encode(clock.now() - timedelta(seconds=1))}
    )
    assert request.revoked() is True
    on_ack.assert_called_once()
    refusal = stored_refusal(app, "m-1")
    assert (refusal.gate, refusal.reason) == ("claim", "deadline_passed")
    assert [d.gate for d in refusals] == ["claim"]


def test_claim_counts_time_spent_waiting_for_a_pool_slot(app: Celery, clock: FakeClock) -> None:
    task = make_task(app, reserve=2)
    request, _ = claim(app, task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=5))})
    assert request.revoked() is False  # on arrival: 5 s left
    clock.advance(3.5)  # waiting behind busy pool processes
    assert request.revoked() is True  # when handed to the pool: 1.5 s < reserve
    assert stored_refusal(app, "m-1").reason == "insufficient_budget"


@pytest.mark.parametrize(
    "header", ["soon", float("inf"), -1, 1e300, True, {"x": 1}, [1.0], "2026-11-29T12:00"]
)
def test_claim_refuses_malformed_headers_without_raising(
    app: Celery, clock: FakeClock, header: object
) -> None:
    task = make_task(app)
    request, on_ack = claim(app, task, {DEADLINE_HEADER: header})
    assert request.revoked() is True
    on_ack.assert_called_once()
    assert stored_refusal(app, "m-1").reason == "invalid_deadline"


def test_claim_lets_a_message_without_deadline_through(app: Celery, clock: FakeClock) -> None:
    request, on_ack = claim(app, make_task(app), {})
    assert request.revoked() is False
    on_ack.assert_not_called()


def test_time_limits_are_capped_at_the_budget_left_when_handed_to_the_pool(
    app: Celery, clock: FakeClock
) -> None:
    task = make_task(app, time_limit=60, soft_time_limit=50)
    request, _ = claim(app, task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=20))})
    clock.advance(8)
    assert request.time_limits == pytest.approx((12.0, 10.0))


def test_time_limits_from_the_message_are_kept_when_shorter(app: Celery, clock: FakeClock) -> None:
    task = make_task(app)
    headers = {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=20)), "timelimit": (8, 6)}
    request, _ = claim(app, task, headers)
    assert request.time_limits == (8, 6)


def test_time_limits_are_untouched_without_a_deadline(app: Celery, clock: FakeClock) -> None:
    request, _ = claim(app, make_task(app), {"timelimit": (8, 6)})
    assert request.time_limits == (8, 6)
