"""A cancel learnt at a lease renewal pulls the running attempt's deadline in
(``core.propagation.pull_in``): ``remaining()``, the outbound gate, a child's enqueue
and the ledger's writes read the earlier one from then on; it never lengthens it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from celery_deadlines.core.propagation import AttemptState, pull_in
from celery_deadlines.rules.budgets import Anchor
from celery_deadlines.rules.stamping import Inherited

STARTED = datetime(2026, 12, 5, 6, 0, tzinfo=UTC)
DEADLINE = STARTED + timedelta(seconds=60)


def running(elapsed: float = 0.0) -> tuple[AttemptState, Any]:
    """An attempt anchored at 100.0 on the monotonic clock with 60 s of budget."""
    state = AttemptState(Inherited(deadline=DEADLINE, source="call"))
    state.anchor = Anchor.at(DEADLINE, STARTED, 100.0)
    attempt = SimpleNamespace(deadline_at=state.anchor.deadline_monotonic())
    state.attempt = attempt  # type: ignore[assignment]
    return state, attempt


def test_a_cancel_learnt_later_than_its_instant_leaves_no_time_from_the_moment_it_is_learnt() -> (
    None
):
    state, attempt = running()
    cancelled_at = STARTED + timedelta(seconds=5)
    pull_in(state, cancelled_at, 106.0)  # learnt a second after the cancel
    assert state.anchor is not None
    # the cancel's instant, a second ago: overrun by that second
    assert state.anchor.remaining(106.0) == timedelta(seconds=-1)
    assert state.carried.deadline == cancelled_at
    assert state.carried.source == "call"
    assert attempt.deadline_at == 105.0


def test_a_cancel_whose_instant_is_later_than_its_learning_by_this_clock_still_leaves_none() -> (
    None
):
    # the database's clock runs behind this one: the cancel's instant reads as ahead
    state, _ = running()
    pull_in(state, STARTED + timedelta(seconds=8), 103.0)
    assert state.anchor is not None
    assert state.anchor.remaining(103.0) == timedelta(0)
    assert state.carried.deadline == STARTED + timedelta(seconds=3)


def test_a_pulled_in_deadline_later_than_the_attempts_changes_nothing() -> None:
    state, attempt = running()
    before = (state.anchor, state.carried, attempt.deadline_at)
    pull_in(state, DEADLINE + timedelta(seconds=30), 170.0)
    assert (state.anchor, state.carried, attempt.deadline_at) == before


def test_an_attempt_without_a_deadline_is_left_to_the_ledgers_own_refusals() -> None:
    state = AttemptState(Inherited())
    pull_in(state, STARTED, 100.0)
    assert state.anchor is None
    assert state.carried.deadline is None
