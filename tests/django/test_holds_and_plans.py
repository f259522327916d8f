"""The clock-skew hold (CLOCK_UNCERTAIN) and stored plans with their resume gate, on
SQLite and PostgreSQL, through Celery's own tracer (``tests.support.trace``).

A worker's clock is put off the ledger's with a :class:`FakeClock`; the ledger's clock
is the database's, so "six minutes later" is an aged plan, never a sleep.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery

from celery_deadlines import (
    Assumption,
    DeadlineTask,
    Plan,
    PlanRefused,
    StaleLease,
    plan_resumed,
    run_claimed,
    run_held,
)
from celery_deadlines.explain import explanation_of
from celery_deadlines.ledger import operations
from celery_deadlines.ledger.attempt import Attempt
from celery_deadlines.ledger.reconcile import reconcile_once
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.ledger.sql.rows import Lease
from celery_deadlines.models import PlanState, Run, RunEvent, RunPlan, Status
from celery_deadlines.rules.plans import steps_of
from celery_deadlines.testing import FakeClock, use_clock
from tests.django.core.test_effects import record
from tests.support.memory_queue import drain
from tests.support.signals import received
from tests.support.trace import execute_next

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgres"])

QUEUE = "plans"
CONTRACTS = {
    f"shop.change_address.{on_expiry}": {"budget": 3600, "on_expiry": on_expiry}
    for on_expiry in ("refuse", "pause", "escalate", "revalidate")
}


#: what the task bodies saw and did, reset by each test's fixture
ran: list[Any] = []
world: dict[str, Any] = {}
log: dict[str, Any] = {}
_apps: dict[tuple[str, float | None], Celery] = {}


def app_for(alias: str, skew_budget: float | None) -> Celery:
    """One app per database and skew budget, its tasks registered once."""
    key = (alias, skew_budget)
    if key in _apps:
        return _apps[key]
    app = _apps[key] = Celery(
        f"plans-{alias}-{skew_budget}", broker="memory://", backend="cache+memory://"
    )
    app.conf.update(
        task_default_queue=QUEUE,
        deadlines_ledger=True,
        deadlines_database=alias,
        deadlines_clock_skew_budget=skew_budget,
        deadlines_contracts=CONTRACTS,
        deadlines_default_budget=600,
    )
    app.task(base=DeadlineTask, bind=True, name="shop.digest")(digest)
    for name in CONTRACTS:
        app.task(base=DeadlineTask, bind=True, name=name, max_retries=3)(change_address)
    return app


def digest_task(app: Celery) -> Any:
    return app.tasks["shop.digest"]


def digest(self: DeadlineTask) -> float:
    ran.append(self.request.id)
    return self.remaining()


def change_address(self: DeadlineTask, order: str) -> str:
    """Seed 003's address change: the first attempt plans and is interrupted by the
    fulfillment service; the next one resumes the stored plan against the world now."""
    verdict = self.resume_plan(current=world)
    log["verdicts"].append(verdict)
    if verdict is None or not verdict.may_execute:
        # first attempt, or revalidating: observe the world again and plan from it
        self.save_plan(address_plan(self.ledger_now(), world["order_state"]))
        if not log["interrupted"]:
            log["interrupted"] = True
            raise self.retry(exc=FulfillmentUnavailable(), countdown=0)
        verdict = self.resume_plan(current=world)
        assert verdict is not None
    log["executed"].extend(steps_of(verdict))
    return "updated"


def run_of(alias: str, task_id: str) -> Run:
    return Run.objects.using(alias).get(task_id=task_id)


def ledger_now(alias: str) -> datetime:
    return Store(alias).database_now()


# -- the clock-skew hold -----------------------------------------------------------------


@pytest.fixture
def skewed(alias: str) -> Iterator[tuple[Celery, list[Any]]]:
    """An app with a 60 s skew budget, and the runs of its task's body. The tests' fake
    clocks stand still while the ledger's runs on: a clock set within the budget stays
    within it however slowly a loaded machine reaches the claim (a 0.5 s budget was
    eaten by 0.1 s of a busy machine)."""
    app = app_for(alias, 60)
    ran.clear()
    drain(app, QUEUE)
    yield app, ran
    drain(app, QUEUE)


@pytest.fixture
def held_signals() -> Iterator[list[dict[str, Any]]]:
    with received(run_held) as sent:
        yield sent


def test_a_worker_whose_clock_is_beyond_the_skew_budget_holds_the_run_unstarted(
    alias: str, skewed: tuple[Celery, list[Any]], held_signals: list[dict[str, Any]]
) -> None:
    app, ran = skewed
    with use_clock(FakeClock(ledger_now(alias) + timedelta(minutes=10))):
        result = digest_task(app).apply_async(task_id="digest-1")
        state, _ = execute_next(app, QUEUE)
    assert (state, ran) == ("IGNORED", [])
    run = run_of(alias, "digest-1")
    # not failed, not expired: waiting for a worker whose clock agrees
    assert (run.status, run.reason) == (Status.CLOCK_UNCERTAIN, "clock_uncertain")
    assert "beyond the skew budget of 60.0 s" in run.detail
    hold = RunEvent.objects.using(alias).get(run=run, kind="clock_hold")
    assert (hold.outcome, hold.status) == ("applied", Status.CLOCK_UNCERTAIN)
    assert [s["task_id"] for s in held_signals] == ["digest-1"]
    assert held_signals[0]["reading"].offset < timedelta(minutes=-9)
    assert result.state == "PENDING"  # no result is stored: the run is not over


def test_a_held_run_is_published_again_only_by_a_worker_whose_clock_agrees(
    alias: str, skewed: tuple[Celery, list[Any]]
) -> None:
    app, ran = skewed
    store = Store(alias)
    with use_clock(FakeClock(ledger_now(alias) + timedelta(minutes=10))):
        digest_task(app).apply_async(task_id="digest-2")
        execute_next(app, QUEUE)
    assert reconcile_once(app, store, clock_certain=False).republished == []
    assert reconcile_once(app, store, clock_certain=True).republished == ["digest-2"]
    assert run_of(alias, "digest-2").status == Status.QUEUED
    assert reconcile_once(app, store, clock_certain=True).republished == []  # once
    with use_clock(FakeClock(ledger_now(alias))):
        state, _ = execute_next(app, QUEUE)
    assert (state, ran) == ("SUCCESS", ["digest-2"])
    run = run_of(alias, "digest-2")
    assert (run.status, run.attempt) == (Status.SUCCEEDED, 2)


def test_a_held_run_whose_deadline_passes_expires_by_the_ledger_clock(
    alias: str, skewed: tuple[Celery, list[Any]]
) -> None:
    app, _ = skewed
    with use_clock(FakeClock(ledger_now(alias) - timedelta(minutes=10))):  # behind, too
        digest_task(app).apply_async(task_id="digest-3", budget=3600)
        execute_next(app, QUEUE)
    assert run_of(alias, "digest-3").status == Status.CLOCK_UNCERTAIN
    Run.objects.using(alias).filter(task_id="digest-3").update(
        deadline=ledger_now(alias) - timedelta(seconds=1)
    )
    assert reconcile_once(app, Store(alias)).expired == ["digest-3"]
    run = run_of(alias, "digest-3")
    assert (run.status, run.reason) == (Status.EXPIRED, "deadline_passed")


def test_with_a_skew_budget_remaining_time_is_measured_on_the_ledger_clock(
    alias: str, skewed: tuple[Celery, list[Any]]
) -> None:
    # the worker's clock is 30 s behind the ledger's, within the 60 s budget: the run
    # goes ahead, and its remaining time is the ledger's view, not 30 s more
    app, _ = skewed
    behind = timedelta(seconds=30)
    before = ledger_now(alias)
    with use_clock(FakeClock(before - behind)) as clock:
        digest_task(app).apply_async(task_id="digest-4", budget=100)
        deadline = clock.now() + timedelta(seconds=100)
        state, remaining = execute_next(app, QUEUE)
        local_view = (deadline - clock.now()).total_seconds()
    after = ledger_now(alias)
    assert state == "SUCCESS"
    assert local_view == 100
    # the ledger's view: the deadline is 70 s after ``before`` on the ledger's clock, and
    # the attempt read that clock between ``before`` and ``after`` (1 ms: its resolution)
    elapsed = (after - before).total_seconds()
    assert 70 - elapsed - 0.001 <= remaining <= 70 + 0.001


def test_a_claim_reports_how_long_the_run_waited_for_a_worker(
    alias: str, skewed: tuple[Celery, list[Any]]
) -> None:
    app, _ = skewed
    with received(run_claimed) as claims:
        digest_task(app).apply_async(task_id="digest-5")
        before = ledger_now(alias)
        Run.objects.using(alias).filter(task_id="digest-5").update(
            published_at=before - timedelta(seconds=30)
        )
        execute_next(app, QUEUE)
        after = ledger_now(alias)
    assert len(claims) == 1
    # published 30 s before ``before``; claimed by the ledger's clock before ``after``
    waited = timedelta(seconds=30)
    assert waited <= claims[0]["queue_wait"] <= waited + (after - before)


# -- plans and the resume gate -----------------------------------------------------------


class FulfillmentUnavailable(Exception):
    pass


ADDRESS_PLAN_STEPS = ({"do": "update_address", "to": "Hauptstr. 5, Berlin"},)


def address_plan(now: datetime, order_state: str = "open") -> Plan:
    return Plan(
        steps=ADDRESS_PLAN_STEPS,
        assumptions=(
            Assumption("order_state", order_state),
            Assumption("customer_confirmation", "confirmed"),
        ),
        created_at=now,
        valid_until=now + timedelta(minutes=5),
        plan_id="address-v1",
    )


@pytest.fixture
def shop(alias: str) -> Iterator[tuple[Celery, dict[str, Any]]]:
    """The address change's app, with the world as the customer left it."""
    app = app_for(alias, None)
    world.clear()
    world.update(order_state="open", customer_confirmation="confirmed")
    log.clear()
    log.update(executed=[], verdicts=[], world=world, interrupted=False)
    drain(app, QUEUE)
    yield app, log
    drain(app, QUEUE)


def interrupted(app: Celery, name: str, task_id: str) -> None:
    """The first attempt plans, then the fulfillment service fails: a retry is queued."""
    app.tasks[name].apply_async(("order-42",), task_id=task_id)
    state, _ = execute_next(app, QUEUE)
    assert state == "RETRY"


def age_plan(alias: str, task_id: str, minutes: float) -> None:
    """Move the stored plan ``minutes`` into the past (the worker was down that long)."""
    stored = RunPlan.objects.using(alias).get(run__task_id=task_id, state=PlanState.ACTIVE)
    document = dict(stored.document)
    for key in ("created_at", "valid_until"):
        instant = datetime.fromisoformat(document[key]) - timedelta(minutes=minutes)
        document[key] = instant.isoformat()
    RunPlan.objects.using(alias).filter(id=stored.id).update(document=document)


def plans_of(alias: str, task_id: str) -> list[tuple[str, str]]:
    rows = RunPlan.objects.using(alias).filter(run__task_id=task_id).order_by("id")
    return [(row.state, row.reason) for row in rows]


def test_a_resumed_plan_that_still_holds_is_executed(
    alias: str, shop: tuple[Celery, dict[str, Any]]
) -> None:
    app, log = shop
    interrupted(app, "shop.change_address.refuse", "addr-1")
    state, result = execute_next(app, QUEUE)
    assert (state, result) == ("SUCCESS", "updated")
    assert log["verdicts"][-1].kind == "continue"
    assert log["executed"] == list(ADDRESS_PLAN_STEPS)
    assert plans_of(alias, "addr-1") == [(PlanState.ACTIVE, "")]


def test_a_plan_whose_assumption_changed_is_refused_with_a_reason_the_user_can_read(
    alias: str, shop: tuple[Celery, dict[str, Any]]
) -> None:
    app, log = shop
    interrupted(app, "shop.change_address.refuse", "addr-2")
    log["world"]["order_state"] = "locked_for_warehouse"  # while the worker was down
    state, refusal = execute_next(app, QUEUE)
    assert state == "FAILURE"
    assert isinstance(refusal, PlanRefused)
    assert refusal.reason == "assumption_changed"
    assert "order_state was 'open', is now 'locked_for_warehouse'" in str(refusal)
    assert log["executed"] == []  # the old plan never ran
    run = run_of(alias, "addr-2")
    assert (run.status, run.reason) == (Status.FAILED, "assumption_changed")
    assert "locked_for_warehouse" in run.detail
    assert plans_of(alias, "addr-2") == [(PlanState.INVALIDATED, "assumption_changed")]
    explanation = explanation_of("addr-2", alias)
    assert explanation is not None
    [plan] = explanation["plans"]
    assert (plan["plan_id"], plan["state"]) == ("address-v1", "INVALIDATED")
    assert plan["reason"] == "assumption_changed"
    assert "locked_for_warehouse" in plan["detail"]
    stored = app.AsyncResult("addr-2")
    with pytest.raises(PlanRefused, match="assumption_changed"):
        stored.get(timeout=1, propagate=True)


@pytest.mark.parametrize("on_expiry", ["pause", "escalate"])
def test_an_expired_plan_pauses_the_run_for_a_person_when_the_contract_says_so(
    alias: str,
    shop: tuple[Celery, dict[str, Any]],
    on_expiry: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app, log = shop
    name = f"shop.change_address.{on_expiry}"
    interrupted(app, name, f"addr-{on_expiry}")
    age_plan(alias, f"addr-{on_expiry}", minutes=6)
    with caplog.at_level(logging.WARNING, logger="celery_deadlines"):
        state, _ = execute_next(app, QUEUE)
    assert state == "IGNORED"  # no result: the run is not over, it waits
    run = run_of(alias, f"addr-{on_expiry}")
    assert (run.status, run.reason) == (Status.PAUSED, "plan_expired")
    assert ("escalated to an operator" in run.detail) == (on_expiry == "escalate")
    paused_log = [r for r in caplog.records if "run PAUSED" in r.getMessage()]
    level = logging.ERROR if on_expiry == "escalate" else logging.WARNING
    assert [r.levelno for r in paused_log] == [level]
    assert log["executed"] == []
    assert plans_of(alias, f"addr-{on_expiry}") == [(PlanState.INVALIDATED, "plan_expired")]
    # nothing claims a paused run; the operator's requeue resumes it with no plan
    assert reconcile_once(app, Store(alias)).republished == []
    store = Store(alias)
    assert store.operator.requeue_now(run.id, "operator")
    operations.republish(app, store, run.id)  # as the admin's action does
    log["world"]["order_state"] = "open"
    state, result = execute_next(app, QUEUE)
    assert (state, result) == ("SUCCESS", "updated")
    assert log["verdicts"] == [None, None]  # the paused attempt stopped in the gate
    assert plans_of(alias, f"addr-{on_expiry}") == [
        (PlanState.INVALIDATED, "plan_expired"),
        (PlanState.ACTIVE, ""),
    ]


def test_a_paused_run_expires_when_its_deadline_passes(
    alias: str, shop: tuple[Celery, dict[str, Any]]
) -> None:
    app, _ = shop
    interrupted(app, "shop.change_address.pause", "addr-late")
    age_plan(alias, "addr-late", minutes=6)
    execute_next(app, QUEUE)
    Run.objects.using(alias).filter(task_id="addr-late").update(
        deadline=ledger_now(alias) - timedelta(seconds=1)
    )
    assert reconcile_once(app, Store(alias)).expired == ["addr-late"]
    run = run_of(alias, "addr-late")
    assert (run.status, run.reason) == (Status.EXPIRED, "deadline_passed")
    assert run.detail == "the deadline passed while the run was paused"


def test_revalidating_an_expired_plan_replans_from_the_world_and_keeps_the_old_as_history(
    alias: str, shop: tuple[Celery, dict[str, Any]]
) -> None:
    app, log = shop
    interrupted(app, "shop.change_address.revalidate", "addr-3")
    age_plan(alias, "addr-3", minutes=6)
    state, result = execute_next(app, QUEUE)
    assert (state, result) == ("SUCCESS", "updated")
    kinds = [v.kind if v else None for v in log["verdicts"]]
    assert kinds == [None, "revalidate"]  # then the body re-read the world and replanned
    assert log["executed"] == list(ADDRESS_PLAN_STEPS)  # the new plan's steps, once
    assert plans_of(alias, "addr-3") == [
        (PlanState.INVALIDATED, "plan_expired"),
        (PlanState.ACTIVE, ""),
    ]


def test_every_resume_is_announced_with_the_action_taken(
    alias: str, shop: tuple[Celery, dict[str, Any]]
) -> None:
    app, _ = shop
    with received(plan_resumed) as resumes:
        interrupted(app, "shop.change_address.revalidate", "addr-4")
        age_plan(alias, "addr-4", minutes=6)
        execute_next(app, QUEUE)
    seen = [(sent["verdict"].kind, sent["action"]) for sent in resumes]
    assert seen == [("revalidate", "revalidate"), ("continue", "continue")]


def test_a_stale_attempt_can_neither_store_nor_retire_a_plan(alias: str) -> None:
    store = Store(alias)
    record(store, "plan-stale")
    ttl = timedelta(seconds=30)
    first = store.runs.claim(
        "plan-stale",
        0,
        task_name="shop.charge",
        owner="w1:1",
        ttl=ttl,
        reserve=timedelta(0),
        max_lost_leases=10,
    )
    assert isinstance(first, Lease)
    plans = store.plans
    assert plans.save(first, "w1:1", "p1", address_plan(datetime.now(UTC)).to_json())
    Run.objects.using(alias).filter(task_id="plan-stale").update(
        lease_expires_at=ledger_now(alias) - timedelta(seconds=2)
    )
    second = store.runs.claim(
        "plan-stale",
        0,
        task_name="shop.charge",
        owner="w2:2",
        ttl=ttl,
        reserve=timedelta(0),
        max_lost_leases=10,
    )
    assert isinstance(second, Lease)
    stored = plans.active(first.run_id)
    assert stored is not None
    assert not plans.save(first, "w1:1", "p-stale", address_plan(datetime.now(UTC)).to_json())
    assert not plans.invalidate(first, "w1:1", stored.row_id, "plan_expired", "stale")
    rejected = RunEvent.objects.using(alias).filter(run__task_id="plan-stale", outcome="rejected")
    assert sorted(e.kind for e in rejected) == ["invalidate_plan", "save_plan"]
    assert {e.lease_token for e in rejected} == {1}
    assert plans_of(alias, "plan-stale") == [(PlanState.ACTIVE, "")]
    assert plans.save(second, "w2:2", "p2", address_plan(datetime.now(UTC)).to_json())
    assert plans_of(alias, "plan-stale") == [(PlanState.SUPERSEDED, ""), (PlanState.ACTIVE, "")]
    attempt = Attempt(store, first, "w1:1", ttl)
    with pytest.raises(StaleLease):
        attempt.checkpoint("late", {})
