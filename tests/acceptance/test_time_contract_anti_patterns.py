"""Seed 003's five anti-patterns, each a regression test that shows the safer result,
on SQLite and PostgreSQL, through Celery's own tracer.

1. one timeout for the whole agent;
2. refreshing timestamps on resume;
3. checking the lease only before the work;
4. retrying an expired action because the error was transient;
5. treating expiry as a silent background failure.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from celery import Celery

from celery_deadlines import (
    DeadlineRefused,
    DeadlineTask,
    DispatchRefused,
    StaleLease,
    deadline_refused,
    run_expired,
)
from celery_deadlines.ledger.attempt import Attempt
from celery_deadlines.ledger.reconcile import reconcile_once
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.ledger.sql.rows import Lease
from celery_deadlines.models import Run, RunEvent, Status
from celery_deadlines.rules.observations import Observation
from tests.django.core.test_effects import charge, record
from tests.support.memory_queue import drain
from tests.support.signals import received
from tests.support.trace import execute, execute_next

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgres"])

QUEUE = "anti"
CONTRACTS = {
    "shop.change_address": {
        "budget": 3600,
        "lease_ttl": 30,
        "attempt_timeout": 20,
        "observation_ttl": {"order_state": 30},
        "revalidate_before": ["order_state"],
    },
}
seen: dict[str, Any] = {}
_apps: dict[str, Celery] = {}


def app_for(alias: str) -> Celery:
    if alias not in _apps:
        app = _apps[alias] = Celery(f"anti-{alias}", broker="memory://", backend="cache+memory://")
        app.conf.update(
            task_default_queue=QUEUE, deadlines_ledger=True, deadlines_database=alias,
            deadlines_contracts=CONTRACTS, deadlines_clock_skew_allowance=0,
        )  # fmt: skip
        app.task(base=DeadlineTask, bind=True, name="shop.change_address")(change_address)
        app.task(base=DeadlineTask, bind=True, name="shop.call_carrier",
                 autoretry_for=(ConnectionError,), retry_backoff=5, retry_jitter=False,
                 max_retries=5)(call_carrier)  # fmt: skip
    return _apps[alias]


def change_address(self: DeadlineTask, step: str) -> Any:
    lease = self.lease
    assert lease is not None
    if step == "clocks":
        seen["lease_for"] = lease.expires_at - lease.database_now if lease.expires_at else None
        seen["deadline_in"] = self.deadline - lease.database_now if self.deadline else None
        seen["observation"] = self.observe("order_state", "open", evidence_id="ev-1")
        self.retry(countdown=3590)  # fits the lease and the budget, not with an attempt
    if step == "observe":
        stored = self.last_checkpoint
        if stored is None:
            observation = self.observe("order_state", "open", evidence_id="ev-1")
            self.checkpoint("observed", observation.to_json())
            raise self.retry(countdown=0)  # the fulfillment service is down: later
        restored = Observation.from_json(stored[1])  # resumed from the checkpoint
        seen["restored"] = restored
        with self.effect("update", key="order-42:address:v1", evidence=[restored],
                         action="commit"):  # fmt: skip
            seen["dispatched"] = True
    return "done"


def call_carrier(self: DeadlineTask) -> None:
    seen.setdefault("calls", 0)
    seen["calls"] += 1
    raise ConnectionError("carrier API timed out")  # transient, says the error


@pytest.fixture
def app(alias: str) -> Iterator[Celery]:
    app = app_for(alias)
    seen.clear()
    drain(app, QUEUE)
    yield app
    drain(app, QUEUE)


def run_of(app: Celery, task_id: str) -> Run:
    return Run.objects.using(app.conf.deadlines_database).get(task_id=task_id)


def test_anti_pattern_1_one_timeout_for_the_whole_agent_each_clock_is_its_own(
    app: Celery,
) -> None:
    task: Any = app.tasks["shop.change_address"]
    task.apply_async(("clocks",), task_id="clocks")
    state, refusal = execute_next(app, QUEUE)
    # the business deadline spans the run, the lease one worker's ownership, the
    # observation one fact's life, the attempt timeout one attempt: four clocks
    assert timedelta(minutes=59) < seen["deadline_in"] <= timedelta(hours=1)
    assert timedelta(seconds=29) < seen["lease_for"] <= timedelta(seconds=30)
    observation = seen["observation"]
    assert observation.expires_at - observation.observed_at == timedelta(seconds=30)
    # a retry in 3590 s fits the budget, but not with a 20 s attempt after it
    assert state == "FAILURE"
    assert isinstance(refusal, DeadlineRefused)
    assert (refusal.gate, refusal.reason) == ("retry", "retry_budget_exhausted")
    assert drain(app, QUEUE) == []


def test_anti_pattern_2_resuming_does_not_refresh_an_observations_timestamps(
    app: Celery,
) -> None:
    task: Any = app.tasks["shop.change_address"]
    task.apply_async(("observe",), task_id="resume")
    assert execute_next(app, QUEUE)[0] == "RETRY"
    alias = app.conf.deadlines_database
    stored = Run.objects.using(alias).get(task_id="resume").checkpoint_data
    assert isinstance(stored, dict)
    # six minutes pass while the worker is down: the observation's age is kept
    aged = dict(stored)
    for key in ("observed_at", "expires_at"):
        aged[key] = (datetime.fromisoformat(stored[key]) - timedelta(minutes=6)).isoformat()
    Run.objects.using(alias).filter(task_id="resume").update(checkpoint_data=aged)
    state, refusal = execute_next(app, QUEUE)  # the retry resumes from the checkpoint
    assert seen["restored"].observed_at == datetime.fromisoformat(aged["observed_at"])
    assert "dispatched" not in seen
    assert state == "FAILURE"
    assert isinstance(refusal, DispatchRefused)
    assert refusal.reason == "stale_evidence"
    assert run_of(app, "resume").reason == "dispatch_refused"


def test_anti_pattern_3_the_lease_is_checked_at_every_write_not_only_before_the_work(
    app: Celery,
) -> None:
    store = Store(app.conf.deadlines_database)
    record(store, "lease-once")
    ttl = timedelta(seconds=30)
    first = store.runs.claim(
        "lease-once",
        0,
        task_name="shop.charge",
        owner="w1:1",
        ttl=ttl,
        reserve=timedelta(0),
        max_lost_leases=10,
    )
    assert isinstance(first, Lease)
    stale = Attempt(store, first, "w1:1", ttl)
    # the first worker checked its lease, then worked too long: the lease lapsed and
    # another worker claimed the run
    Run.objects.using(store.using).filter(task_id="lease-once").update(
        lease_expires_at=store.database_now() - timedelta(seconds=2)
    )
    second = store.runs.claim(
        "lease-once",
        0,
        task_name="shop.charge",
        owner="w2:2",
        ttl=ttl,
        reserve=timedelta(0),
        max_lost_leases=10,
    )
    assert isinstance(second, Lease)
    with pytest.raises(StaleLease):
        stale.checkpoint("late", {})
    with pytest.raises(DispatchRefused) as refused, charge(stale):
        pytest.fail("the stale worker must not call out")
    assert refused.value.reason == "stale_lease"
    with pytest.raises(StaleLease):
        stale.succeed()
    rejected = RunEvent.objects.using(store.using).filter(
        run__task_id="lease-once", outcome="rejected"
    )
    assert {event.kind for event in rejected} >= {"checkpoint", "dispatch", "succeeded"}
    assert {event.lease_token for event in rejected} == {1}


def test_anti_pattern_4_an_expired_action_is_not_retried_because_the_error_was_transient(
    app: Celery,
) -> None:
    task: Any = app.tasks["shop.call_carrier"]
    task.apply_async(task_id="carrier", budget=3)  # less than one backoff step left
    state, refusal = execute_next(app, QUEUE)
    assert seen["calls"] == 1
    assert state == "FAILURE"
    assert isinstance(refusal, DeadlineRefused)
    assert refusal.reason == "retry_budget_exhausted"
    assert "carrier API timed out" in refusal.detail  # the transient error is named
    assert drain(app, QUEUE) == []  # no retry published
    run = run_of(app, "carrier")
    assert (run.status, run.reason) == (Status.EXPIRED, "retry_budget_exhausted")


def test_anti_pattern_5_expiry_is_never_a_silent_background_failure(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    task: Any = app.tasks["shop.change_address"]
    with received(deadline_refused) as refused, received(run_expired) as expired:
        # a message that arrives after its deadline, and a run nobody claimed in time
        task.apply_async(("clocks",), task_id="late", budget=60)
        task.apply_async(("clocks",), task_id="never-claimed", budget=60)
        alias = app.conf.deadlines_database
        past = Store(alias).database_now() - timedelta(seconds=1)
        # both wait in the queue past their deadline (the header and the ledger agree)
        Run.objects.using(alias).filter(task_id__in=["late", "never-claimed"]).update(deadline=past)
        messages = drain(app, QUEUE)
        late = next(m for m in messages if m["headers"]["id"] == "late")
        late["headers"]["x_deadline"] = past.timestamp()
        with caplog.at_level(logging.WARNING, logger="celery_deadlines"):
            state, _ = execute(app, late)
            reconcile_once(app, Store(alias))
    refusals = [f"{sent['task_id']}:{sent['decision'].reason}" for sent in refused]
    expiries = [f"{sent['task_id']}:{sent['reason']}" for sent in expired]
    # the caller is told, with a reason; the operator sees a log, a signal, a state
    assert state == "IGNORED"
    assert isinstance(app.AsyncResult("late").result, DeadlineRefused)
    assert refusals == ["late:deadline_passed"]  # refused at a gate
    assert expiries == ["never-claimed:deadline_passed"]  # found by the sweeper
    assert "refused at attempt gate: deadline_passed" in caplog.text
    assert "[never-claimed] EXPIRED (deadline_passed)" in caplog.text
    swept = app.AsyncResult("never-claimed").result
    assert isinstance(swept, DeadlineRefused)
    assert swept.reason == "deadline_passed"
    for task_id, reason in (("late", "deadline_passed"), ("never-claimed", "deadline_passed")):
        run = run_of(app, task_id)
        assert (run.status, run.reason) == (Status.EXPIRED, reason)
        assert RunEvent.objects.using(alias).filter(run=run, status=Status.EXPIRED).exists()
