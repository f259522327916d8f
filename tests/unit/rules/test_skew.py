"""The clock-skew budget and the decision gate, in seed 001's order (pure rules)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from celery_deadlines.rules.skew import ClockReading, Readiness, gate

T = datetime(2026, 8, 19, 8, 0, tzinfo=UTC)
BUDGET = timedelta(milliseconds=500)
MS = timedelta(milliseconds=1)


def reading(offset_ms: float, round_trip_ms: float = 4) -> ClockReading:
    """The authority read mid-way through a round trip, ``offset_ms`` ahead of us."""
    before = T
    after = T + round_trip_ms * MS
    return ClockReading.between(before, before + (round_trip_ms / 2 + offset_ms) * MS, after)


def test_a_reading_is_the_offset_from_the_midpoint_and_half_the_round_trip() -> None:
    measured = reading(120, round_trip_ms=10)
    assert (measured.offset, measured.uncertainty) == (120 * MS, 5 * MS)
    assert measured.error_bound == 125 * MS
    assert measured.corrected(T) == T + 120 * MS


def test_the_order_is_uncertain_then_not_ready_then_expired_then_dispatchable() -> None:
    due, deadline = T + timedelta(minutes=1), T + timedelta(minutes=5)
    assert gate(T, reading(0), BUDGET, not_before=due, deadline=deadline) is Readiness.NOT_READY
    at = T + timedelta(minutes=2)
    assert gate(at, reading(0), BUDGET, not_before=due, deadline=deadline) is Readiness.DISPATCHABLE
    late = T + timedelta(minutes=5)
    assert gate(late, reading(0), BUDGET, not_before=due, deadline=deadline) is Readiness.EXPIRED
    # due and in time by the local clock, but the clock is in doubt: nothing is dispatched
    doubtful = gate(at, reading(900), BUDGET, not_before=due, deadline=deadline)
    assert doubtful is Readiness.CLOCK_UNCERTAIN


@pytest.mark.parametrize(
    ("fault", "offset_ms"),
    [("clock jumped backward", -600_000), ("clock jumped forward", 600_000)],
)
def test_a_clock_that_jumped_either_way_holds_new_dispatch(fault: str, offset_ms: float) -> None:
    assert gate(T, reading(offset_ms), BUDGET, deadline=T + timedelta(hours=1)) is (
        Readiness.CLOCK_UNCERTAIN
    ), fault


def test_an_unreachable_authority_is_uncertainty_not_permission() -> None:
    assert gate(T, None, BUDGET) is Readiness.CLOCK_UNCERTAIN


def test_a_slow_round_trip_alone_can_exceed_the_budget() -> None:
    assert not reading(0, round_trip_ms=1200).within(BUDGET)  # +/- 600 ms: too unsure


def test_a_local_clock_stepping_back_during_the_measurement_proves_nothing() -> None:
    stepped = ClockReading.between(T, T, T - timedelta(seconds=1))
    assert not stepped.within(timedelta(days=365))


def test_within_the_budget_local_time_is_corrected_onto_the_authority() -> None:
    # 300 ms behind the authority: a deadline 200 ms ahead locally has already passed
    assert gate(T, reading(300), BUDGET, deadline=T + 200 * MS) is Readiness.EXPIRED
