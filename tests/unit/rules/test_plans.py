"""A resumed plan must earn the right to continue (seed 003's address change)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from celery_deadlines.rules.plans import Assumption, Plan, resume, steps_of

MADE = datetime(2026, 3, 12, 10, 0, tzinfo=UTC)


def address_change() -> Plan:
    return Plan(
        steps=({"tool": "change_address", "args": {"order": 42, "to": "Elm St 1"}},),
        assumptions=(
            Assumption("order_state", ("editable", "packing"), one_of=True),
            Assumption("customer_confirmed", True),
        ),
        created_at=MADE,
        valid_until=MADE + timedelta(minutes=5),
        plan_id="plan-42",
    )


NOW_FACTS = {"order_state": "editable", "customer_confirmed": True}


def test_a_plan_within_its_validity_whose_assumptions_hold_continues() -> None:
    verdict = resume(address_change(), MADE + timedelta(minutes=2), NOW_FACTS)
    assert (verdict.kind, verdict.reason, verdict.may_execute) == ("continue", "", True)
    assert steps_of(verdict) == address_change().steps


def test_a_plan_whose_order_moved_to_a_locked_queue_meanwhile_is_refused() -> None:
    # seed 003: while the worker was down the order moved to a locked warehouse queue;
    # the saved plan is refused with a reason the user can read
    facts = {**NOW_FACTS, "order_state": "locked_in_warehouse"}
    verdict = resume(address_change(), MADE + timedelta(minutes=4), facts)
    assert (verdict.kind, verdict.reason) == ("replan", "assumption_changed")
    assert steps_of(verdict) == ()  # kept as history, never executed
    assert verdict.plan == address_change()
    assert verdict.explain() == (
        "the plan no longer applies: order_state was ('editable', 'packing'), "
        "is now 'locked_in_warehouse'"
    )


def test_an_expired_plan_is_revalidated_even_if_its_assumptions_happen_to_hold() -> None:
    verdict = resume(address_change(), MADE + timedelta(minutes=6), NOW_FACTS)
    assert (verdict.kind, verdict.reason) == ("revalidate", "plan_expired")
    assert not verdict.may_execute
    assert "expired at 2026-03-12T10:05:00+00:00" in verdict.explain()


def test_a_fact_that_could_not_be_read_counts_as_changed() -> None:
    verdict = resume(address_change(), MADE, {"order_state": "editable"})
    assert [(c.key, repr(c.found)) for c in verdict.changed] == [
        ("customer_confirmed", "<not found>")
    ]


def test_a_plan_restored_from_a_checkpoint_keeps_its_age() -> None:
    restored = Plan.from_json(json.loads(json.dumps(address_change().to_json())))
    assert restored == address_change()
    assert resume(restored, MADE + timedelta(minutes=6), NOW_FACTS).reason == "plan_expired"


def test_a_plan_needs_aware_instants_and_some_validity() -> None:
    with pytest.raises(ValueError, match="valid for some time"):
        Plan((), (), MADE, MADE)
    with pytest.raises(ValueError, match="timezone-aware"):
        Plan((), (), datetime(2026, 3, 12), MADE)


def test_a_tuple_assumption_still_holds_after_a_json_checkpoint() -> None:
    plan = Plan((), (Assumption("dims", (1, 2)),), MADE, MADE + timedelta(minutes=5))
    restored = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert resume(restored, MADE, {"dims": [1, 2]}).kind == "continue"


def test_one_of_needs_a_collection_not_a_string() -> None:
    with pytest.raises(ValueError, match="one_of needs a collection"):
        Assumption("state", "editable", one_of=True)
