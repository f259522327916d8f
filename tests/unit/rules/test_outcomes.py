"""How a run ends or moves, as pure decisions: after a body, a time limit, a lapse, a plan."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from celery_deadlines.errors import DeadlineRefused, DispatchRefused, PlanRefused
from celery_deadlines.rules.contracts import OnExpiry
from celery_deadlines.rules.outcomes import (
    DEADLINE_CAP_SLACK,
    TRACEBACK_LIMIT,
    CeleryEnd,
    PlanStep,
    Settle,
    after_body,
    after_plan,
    after_time_limit,
    bounded_traceback,
    celery_revocation,
    performed_past_deadline_detail,
    settle_lapsed,
    told_as_celery_expiry,
)
from celery_deadlines.rules.states import Status

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class Rejected(Exception):
    reason = "bad message"


@pytest.mark.parametrize(
    ("exc", "celery", "status", "reason"),
    [
        (Exception("ignored"), "ignore", Status.SUCCEEDED, "ignored"),
        (Rejected(), "reject", Status.FAILED, "rejected"),
        (Rejected(), "requeue", None, ""),
        (
            DeadlineRefused("retry", "retry_budget_exhausted", None, NOW.isoformat()),
            None,
            Status.EXPIRED,
            "retry_budget_exhausted",
        ),
        (PlanRefused("plan_expired", "too old"), None, Status.FAILED, "plan_expired"),
        (DispatchRefused("k", "unresolved"), None, Status.FAILED, "dispatch_refused"),
        (ValueError("boom"), None, Status.FAILED, "error"),
    ],
)
def test_the_runs_end_follows_what_the_body_raised(
    exc: BaseException, celery: CeleryEnd, status: Status | None, reason: str
) -> None:
    outcome = after_body(exc, celery=celery, unresolved_keys=frozenset())
    assert (outcome.status, outcome.reason) == (status, reason)
    assert outcome.released is (status is None)


@pytest.mark.parametrize("celery", ["ignore", "reject", "requeue", None])
def test_an_unresolved_effect_makes_the_run_unknown_whatever_was_raised(
    celery: CeleryEnd,
) -> None:
    outcome = after_body(ValueError("late"), celery=celery, unresolved_keys={"pay-2", "pay-1"})
    assert (outcome.status, outcome.reason) == (Status.UNKNOWN, "effect_unresolved")
    assert outcome.detail.startswith("outcome unknown for effect(s) pay-1, pay-2 after")


def test_a_time_limit_at_the_deadline_was_the_deadlines_cap_and_expires_the_run() -> None:
    deadline = NOW + DEADLINE_CAP_SLACK / 2
    assert after_time_limit(deadline, NOW) == (Status.EXPIRED, "deadline_passed")


def test_a_delivery_tasks_time_limit_at_its_deadline_expires_it_as_delivery_expired() -> None:
    deadline = NOW + DEADLINE_CAP_SLACK / 2
    assert after_time_limit(deadline, NOW, delivery_task=True) == (
        Status.EXPIRED,
        "delivery_expired",
    )


def test_a_time_limit_well_before_the_deadline_was_the_tasks_own_and_fails_the_run() -> None:
    deadline = NOW + DEADLINE_CAP_SLACK + timedelta(seconds=5)
    assert after_time_limit(deadline, NOW) == (Status.FAILED, "time_limit")
    assert after_time_limit(None, NOW) == (Status.FAILED, "time_limit")


@pytest.mark.parametrize(
    ("unresolved", "past", "lost", "step"),
    [
        (True, True, 99, Settle.UNKNOWN),  # reconcile the effect first, whatever else
        (False, True, 99, Settle.EXPIRE),  # then never resurrect a run past its deadline
        (False, False, 3, Settle.FAIL),  # then stop a task that keeps killing its worker
        (False, False, 2, Settle.REQUEUE),
    ],
)
def test_a_lapsed_run_is_settled_in_order_of_priority(
    unresolved: bool, past: bool, lost: int, step: Settle
) -> None:
    decided = settle_lapsed(
        unresolved_effect=unresolved, past_deadline=past, lost_leases=lost, max_lost=3
    )
    assert decided is step


@pytest.mark.parametrize("on_expiry", list(OnExpiry))
def test_a_plan_that_may_go_on_continues_whatever_the_contract_says(on_expiry: OnExpiry) -> None:
    assert after_plan(True, on_expiry) is PlanStep.CONTINUE


@pytest.mark.parametrize("on_expiry", list(OnExpiry))
def test_a_plan_that_may_not_go_on_follows_its_contract(on_expiry: OnExpiry) -> None:
    assert after_plan(False, on_expiry).value == on_expiry.value


def test_a_failed_bodys_traceback_is_kept_whole_up_to_its_bound_and_by_its_end_past_it() -> None:
    short = "Traceback (most recent call last):\n  ...\nValueError: declined\n"
    assert bounded_traceback(short) == short
    frames = "".join(f'  File "app.py", line {n}, in step_{n}\n' for n in range(2000))
    long = f"Traceback (most recent call last):\n{frames}ValueError: declined\n"
    kept = bounded_traceback(long)
    cut = len(long) - TRACEBACK_LIMIT
    assert kept.startswith(f"[{cut} characters of outer frames cut]\n")
    assert kept.endswith("ValueError: declined\n")
    assert len(kept) == TRACEBACK_LIMIT + len(f"[{cut} characters of outer frames cut]\n")


def test_a_run_ended_past_its_deadline_after_an_effect_names_what_was_performed() -> None:
    said = performed_past_deadline_detail({"order-42:pay": "pay", "order-42:mail": "mail"})
    assert said == (
        "performed: mail (order-42:mail), pay (order-42:pay); its outcome was settled after "
        "the deadline, so the task did not go on after it (its result is not replayed)"
    )


@pytest.mark.parametrize("reason", ["deadline_passed", "insufficient_budget"])
def test_a_refusal_for_a_deadline_that_was_celerys_expires_is_told_as_celerys_expiry(
    reason: str,
) -> None:
    assert told_as_celery_expiry(reason, "expires")


@pytest.mark.parametrize(
    "reason",
    [
        "retry_budget_exhausted",
        "invalid_deadline",
        "delivery_expired",
        "workflow_cannot_fit",
        "expired_by_operator",
        "performed_past_deadline",
        None,
    ],
)
def test_a_refusal_for_anything_but_the_deadline_itself_is_told_as_the_refusal_it_is(
    reason: str | None,
) -> None:
    assert not told_as_celery_expiry(reason, "expires")


@pytest.mark.parametrize("source", ["call", "task", "setting", "default", "scope", "parent", None])
def test_a_refusal_for_a_deadline_from_anywhere_but_expires_is_told_as_the_refusal_it_is(
    source: str | None,
) -> None:
    assert not told_as_celery_expiry("deadline_passed", source)


@pytest.mark.parametrize("source", ["expires", "call", "parent", None])
def test_a_cancelled_run_is_told_as_celerys_revoke_whatever_its_deadlines_source(
    source: str | None,
) -> None:
    assert celery_revocation("cancelled", source) == "revoked"


def test_a_refusal_for_an_expires_deadline_is_told_as_celerys_expiry_and_others_as_they_are() -> (
    None
):
    assert celery_revocation("deadline_passed", "expires") == "expired"
    assert celery_revocation("deadline_passed", "call") is None
    assert celery_revocation("expired_by_operator", "expires") is None


def test_the_claims_cancelled_refusal_is_the_gates_cancelled_reason() -> None:
    from celery_deadlines.rules.gates import Reason, claim_refusal

    assert claim_refusal("cancelled") is Reason.CANCELLED
