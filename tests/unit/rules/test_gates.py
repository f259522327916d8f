"""The gates as pure functions: every rule, its boundary, its reason code."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from celery_deadlines import DeadlineRefused, Gate, Reason
from celery_deadlines.rules.gates import (
    admit,
    allow_retry,
    as_delivery,
    cap_time_limits,
    claim_refusal,
    expiry_reason,
    invalid,
    latest_start,
    retry_wait,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


def test_enqueue_is_allowed_with_budget_left_and_reports_what_is_left() -> None:
    decision = admit(Gate.ENQUEUE, NOW + seconds(30), NOW, reserve=seconds(2))
    assert decision.allowed
    assert decision.remaining == seconds(30)


def test_enqueue_is_refused_when_the_deadline_has_passed() -> None:
    decision = admit(Gate.ENQUEUE, NOW - seconds(1), NOW)
    assert decision.reason is Reason.DEADLINE_PASSED
    assert "passed 1.000 s ago" in decision.detail


def test_deadline_exactly_now_leaves_no_time_to_start() -> None:
    assert admit(Gate.CLAIM, NOW, NOW).reason is Reason.DEADLINE_PASSED


def test_claim_is_refused_when_less_than_the_reserve_is_left() -> None:
    decision = admit(Gate.CLAIM, NOW + seconds(1.5), NOW, reserve=seconds(2))
    assert decision.reason is Reason.INSUFFICIENT_BUDGET
    assert decision.gate is Gate.CLAIM


def test_claim_is_allowed_when_exactly_the_reserve_is_left() -> None:
    assert admit(Gate.CLAIM, NOW + seconds(2), NOW, reserve=seconds(2)).allowed


def test_enqueue_with_a_countdown_past_the_deadline_is_refused() -> None:
    decision = admit(Gate.ENQUEUE, NOW + seconds(10), NOW, starts_at=NOW + seconds(11))
    assert decision.reason is Reason.DEADLINE_PASSED
    assert "earliest start" in decision.detail


def test_enqueue_with_a_countdown_that_eats_into_the_reserve_is_refused() -> None:
    decision = admit(
        Gate.ENQUEUE, NOW + seconds(10), NOW, reserve=seconds(3), starts_at=NOW + seconds(8)
    )
    assert decision.reason is Reason.INSUFFICIENT_BUDGET


def test_an_eta_in_the_past_counts_as_now() -> None:
    assert admit(Gate.ENQUEUE, NOW + seconds(5), NOW, starts_at=NOW - seconds(60)).allowed


def test_refusal_carries_gate_reason_deadline_and_clock_reading() -> None:
    refusal = admit(Gate.CLAIM, NOW - seconds(1), NOW).refusal()
    assert isinstance(refusal, DeadlineRefused)
    assert (refusal.gate, refusal.reason) == ("claim", "deadline_passed")
    assert refusal.deadline_at == NOW - seconds(1)
    assert refusal.clock_read_at == NOW
    assert "claim gate refused: deadline_passed" in str(refusal)


def test_refusal_args_rebuild_the_same_exception() -> None:
    """Celery's JSON result serializer rebuilds exceptions as cls(*args)."""
    refusal = admit(Gate.CLAIM, NOW - seconds(1), NOW).refusal()
    rebuilt = DeadlineRefused(*refusal.args)
    assert rebuilt.args == refusal.args
    assert str(rebuilt) == str(refusal)


def test_an_allowed_decision_has_no_refusal() -> None:
    with pytest.raises(ValueError, match="not a refusal"):
        admit(Gate.CLAIM, NOW + seconds(5), NOW).refusal()


def test_unreadable_header_is_refused_as_invalid_deadline_without_a_deadline() -> None:
    decision = invalid(Gate.CLAIM, NOW, "unreadable deadline header 'soon'")
    assert decision.reason is Reason.INVALID_DEADLINE
    assert decision.refusal().deadline is None


def test_retry_is_allowed_when_backoff_and_attempt_fit_in_the_remaining_budget() -> None:
    decision = allow_retry(
        NOW + seconds(10),
        NOW,
        remaining=seconds(10),
        countdown=seconds(4),
        attempt_timeout=seconds(5),
        skew_allowance=seconds(0.5),
    )
    assert decision.allowed


def test_retry_is_refused_when_backoff_exceeds_remaining_budget() -> None:
    decision = allow_retry(
        NOW + seconds(3),
        NOW,
        remaining=seconds(3),
        countdown=seconds(4),
        attempt_timeout=seconds(0),
        skew_allowance=seconds(0),
    )
    assert decision.reason is Reason.RETRY_BUDGET_EXHAUSTED
    assert decision.gate is Gate.RETRY


def test_retry_is_refused_when_the_attempt_timeout_does_not_fit_after_the_backoff() -> None:
    """Seed 004: a retry with a 2 s provider timeout is unsafe when 0.5 s remain."""
    decision = allow_retry(
        NOW + seconds(0.5),
        NOW,
        remaining=seconds(0.5),
        countdown=seconds(0),
        attempt_timeout=seconds(2),
        skew_allowance=seconds(0),
    )
    assert decision.reason is Reason.RETRY_BUDGET_EXHAUSTED
    assert "attempt timeout 2.000 s" in decision.detail


def test_retry_reservation_includes_the_skew_allowance() -> None:
    decision = allow_retry(
        NOW + seconds(5),
        NOW,
        remaining=seconds(5),
        countdown=seconds(2),
        attempt_timeout=seconds(2.5),
        skew_allowance=seconds(1),
    )
    assert decision.reason is Reason.RETRY_BUDGET_EXHAUSTED


def test_retry_is_refused_when_less_than_the_reserve_would_be_left_when_it_is_due() -> None:
    decision = allow_retry(
        NOW + seconds(6),
        NOW,
        remaining=seconds(6),
        countdown=seconds(2),
        attempt_timeout=seconds(1),
        skew_allowance=seconds(0),
        reserve=seconds(5),
    )
    assert decision.reason is Reason.RETRY_BUDGET_EXHAUSTED
    assert "reserve 5.000 s" in decision.detail


durations = st.floats(min_value=0, max_value=3600, allow_nan=False, allow_infinity=False)


@given(remaining=durations, countdown=durations, timeout=durations, skew=durations)
@example(remaining=5.0, countdown=2.0, timeout=2.5, skew=0.5)
def test_retry_rule_is_exactly_countdown_plus_timeout_plus_skew_within_remaining(
    remaining: float, countdown: float, timeout: float, skew: float
) -> None:
    decision = allow_retry(
        NOW + seconds(remaining),
        NOW,
        remaining=seconds(remaining),
        countdown=seconds(countdown),
        attempt_timeout=seconds(timeout),
        skew_allowance=seconds(skew),
    )
    needed = seconds(countdown) + seconds(timeout) + seconds(skew)
    assert decision.allowed == (needed <= seconds(remaining))


@given(remaining=durations, countdown=durations, timeout=durations, more=durations)
def test_more_backoff_never_turns_a_refused_retry_into_an_allowed_one(
    remaining: float, countdown: float, timeout: float, more: float
) -> None:
    def allowed(wait: float) -> bool:
        return allow_retry(
            NOW,
            NOW,
            remaining=seconds(remaining),
            countdown=seconds(wait),
            attempt_timeout=seconds(timeout),
            skew_allowance=seconds(0),
        ).allowed

    if not allowed(countdown):
        assert not allowed(countdown + more)


def test_attempt_limits_are_capped_at_the_remaining_budget() -> None:
    assert cap_time_limits(4.0, hard=30, soft=30, floor=0.01) == (4.0, 4.0)


def test_a_capped_soft_limit_keeps_the_tasks_cleanup_window_in_proportion() -> None:
    capped = cap_time_limits(6.0, hard=60, soft=50, floor=0.01)
    assert capped == pytest.approx((6.0, 5.0))


def test_a_soft_limit_alone_is_capped_at_the_budget_with_a_hard_stop_there() -> None:
    assert cap_time_limits(4.0, hard=None, soft=20, floor=0.01) == (4.0, 4.0)


def test_attempt_limits_shorter_than_the_budget_are_kept() -> None:
    assert cap_time_limits(40.0, hard=30, soft=20, floor=0.01) == (30, 20)


def test_an_attempt_with_no_limits_gets_a_hard_limit_at_the_budget_and_no_soft_one() -> None:
    assert cap_time_limits(4.0, hard=None, soft=None, floor=0.01) == (4.0, None)


def test_a_spent_budget_gets_the_floor_never_zero_which_means_unlimited() -> None:
    assert cap_time_limits(-1.0, hard=None, soft=5, floor=0.01) == (0.01, 0.01)
    assert cap_time_limits(-1.0, hard=10, soft=5, floor=0.01) == (0.01, 0.01)


def test_a_claim_the_ledger_refused_for_the_deadline_keeps_the_ledgers_judgement() -> None:
    assert claim_refusal("deadline_passed") is Reason.DEADLINE_PASSED
    assert claim_refusal("deadline") is Reason.INSUFFICIENT_BUDGET
    assert claim_refusal("held") is None


def test_a_retry_waits_for_its_eta_else_its_countdown_else_the_default_delay() -> None:
    assert retry_wait(NOW + seconds(4), 99, 180, NOW) == seconds(4)
    assert retry_wait(NOW - seconds(4), None, 180, NOW) == seconds(0)
    assert retry_wait(None, 2.5, 180, NOW) == seconds(2.5)
    assert retry_wait(None, None, 180, NOW) == seconds(180)
    assert retry_wait(None, -3, None, NOW) == seconds(0)


def test_a_passed_deadline_has_one_reason_for_each_kind_of_task() -> None:
    # the sweeper, the reconciler and the time limit use the word a gate would use
    assert expiry_reason(delivery_task=False) is Reason.DEADLINE_PASSED
    assert expiry_reason(delivery_task=True) is Reason.DELIVERY_EXPIRED
    refused = admit(Gate.CLAIM, NOW - timedelta(seconds=1), NOW, timedelta(0))
    assert refused.reason is expiry_reason(delivery_task=False)
    assert as_delivery(refused).reason is expiry_reason(delivery_task=True)


@pytest.mark.parametrize("reserve", [timedelta(0), timedelta(microseconds=1), seconds(2)])
@pytest.mark.parametrize("offset_us", [-2, -1, 0, 1, 2])
def test_the_latest_start_is_the_last_instant_admit_allows(
    reserve: timedelta, offset_us: int
) -> None:
    deadline = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    latest = latest_start(deadline, reserve)
    now = latest + timedelta(microseconds=offset_us)
    assert admit(Gate.CLAIM, deadline, now, reserve).allowed is (now <= latest)


def test_an_absurd_reserve_gives_a_latest_start_no_clock_reaches() -> None:
    deadline = datetime(1970, 1, 2, tzinfo=UTC)
    assert latest_start(deadline, timedelta(days=999_999)) == datetime.min.replace(tzinfo=UTC)
