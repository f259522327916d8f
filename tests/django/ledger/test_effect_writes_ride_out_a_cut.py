"""The writes a body makes through the library ride out a database cut (issue 31, item 1):
an effect's intent, guard and outcome, a checkpoint, a stored plan and the ledger's clock
an observation is stamped with, on SQLite and PostgreSQL.

Each test injects the cut where the nemesis soak met it: a statement that raises
``OperationalError`` before it reached the database, or after it committed (its answer
lost). The write is tried again every ``RETRY_INTERVAL`` for at most one lease; a
write that had committed is found, never made twice; after a whole lease without the
database the attempt stops (``StaleLease``: the body's failure is never the cut's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import OperationalError

from celery_deadlines.errors import StaleLease
from celery_deadlines.ledger import patience
from celery_deadlines.ledger.attempt import Attempt
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.ledger.sql.effects import Effects
from celery_deadlines.ledger.sql.plans import Plans
from celery_deadlines.ledger.sql.runs import Runs
from celery_deadlines.models import EffectState, Run, RunEvent, RunPlan
from celery_deadlines.testing import FakeClock
from tests.django.core.test_effects import TTL, attempt, charge, effect, record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgres"])

CUT = "consuming input failed: server closed the connection unexpectedly"


@pytest.fixture
def store(alias: str, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setattr(patience, "RETRY_INTERVAL", 0)
    return Store(alias)


def cut(
    monkeypatch: pytest.MonkeyPatch,
    statement: str,
    *,
    times: int = 1,
    committed: bool = False,
    clock: FakeClock | None = None,
    of: type = Effects,
) -> list[int]:
    """``<of>.<statement>`` (``Effects`` by default) loses its connection ``times``
    times: before reaching the database, or after committing (``committed``); each cut
    lasts 5 s on ``clock``."""
    real = getattr(of, statement)
    calls: list[int] = []

    def cut_statement(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) <= times:
            if committed:
                real(self, *args, **kwargs)
            if clock is not None:
                clock.advance(5)
            raise OperationalError(CUT)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(of, statement, cut_statement)
    return calls


def provider_call(store: Store, current: Attempt, calls: list[str]) -> Callable[[], None]:
    def pay() -> None:
        with charge(current) as fx:
            calls.append(f"pay under dispatch {fx.fence}")
            fx.succeed({"paid": 100})

    return pay


@pytest.mark.parametrize("committed", [False, True], ids=["cut-before", "answer-lost"])
@pytest.mark.parametrize("statement", ["record_intent", "dispatch", "succeed"])
def test_an_effect_write_cut_once_is_written_once_and_the_provider_called_once(
    store: Store, monkeypatch: pytest.MonkeyPatch, statement: str, committed: bool
) -> None:
    record(store)
    current = attempt(store, "w1:1")
    tries = cut(monkeypatch, statement, committed=committed)
    calls: list[str] = []
    provider_call(store, current, calls)()
    assert calls == ["pay under dispatch 1"]
    # a cut before the database: written again; a lost answer: its commit is found
    # (the intent, an upsert, is simply written again: it finds itself)
    found_commit = committed and statement != "record_intent"
    assert len(tries) == (1 if found_commit else 2)
    found = effect(store)
    assert (found.state, found.dispatches, found.result) == (
        EffectState.SUCCEEDED, 1, {"paid": 100},
    )  # fmt: skip
    rejected = RunEvent.objects.using(store.using).filter(outcome="rejected")
    assert list(rejected.values_list("kind", flat=True)) == []  # nothing refused


def test_an_ambiguous_outcome_whose_write_meets_a_cut_is_still_recorded_unknown(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(store)
    current = attempt(store, "w1:1")
    cut(monkeypatch, "unknown")
    with pytest.raises(TimeoutError), charge(current):
        raise TimeoutError("the provider did not answer")
    assert effect(store).state == EffectState.UNKNOWN
    assert current.unresolved == {"order-42:charge:v1"}  # the run ends UNKNOWN, never FAILED


def test_a_checkpoint_that_meets_a_cut_is_written_once_the_database_is_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(store)
    current = attempt(store, "w1:1")
    real = Runs.checkpoint
    calls: list[int] = []

    def checkpoint(self: Runs, *args: Any, **kwargs: Any) -> bool:
        calls.append(1)
        if len(calls) == 1:
            real(self, *args, **kwargs)  # committed; its answer lost
            raise OperationalError(CUT)
        return bool(real(self, *args, **kwargs))

    monkeypatch.setattr(Runs, "checkpoint", checkpoint)
    current.checkpoint("paid", {"payment": "P-1"})
    run = Run.objects.using(store.using).get(task_id="charge-1")
    assert (run.checkpoint_name, run.checkpoint_data, len(calls)) == (
        "paid", {"payment": "P-1"}, 2,
    )  # fmt: skip


def test_a_database_away_for_a_whole_lease_stops_the_attempt_without_failing_the_run(
    store: Store, monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    record(store)
    current = attempt(store, "w1:1")
    lease_seconds = TTL.total_seconds()
    tries = cut(monkeypatch, "dispatch", times=999, clock=clock)
    calls: list[str] = []
    with pytest.raises(StaleLease, match="unreachable"):
        provider_call(store, current, calls)()
    assert calls == []  # the guard never passed: the provider was never called
    assert len(tries) == int(lease_seconds // 5)  # one lease of tries, 5 s each
    assert current.lost
    run = Run.objects.using(store.using).get(task_id="charge-1")
    assert (run.status, effect(store).state) == ("RUNNING", EffectState.INTENT_RECORDED)


def plan_document(step: str) -> dict[str, Any]:
    return {"plan_id": f"plan-{step}", "steps": [step]}


def stored_plans(store: Store) -> list[tuple[str, str]]:
    """The run's plans as the ledger keeps them, oldest first: (plan id, state)."""
    plans = RunPlan.objects.using(store.using).order_by("id")
    return [(plan.plan_id, plan.state) for plan in plans]


@pytest.mark.parametrize("committed", [False, True], ids=["cut-before", "answer-lost"])
def test_a_plan_saved_through_a_cut_is_stored_once_and_is_the_active_one(
    store: Store, monkeypatch: pytest.MonkeyPatch, committed: bool
) -> None:
    record(store)
    current = attempt(store, "w1:1")
    current.save_plan("plan-a", plan_document("a"))
    tries = cut(monkeypatch, "save", committed=committed, of=Plans)
    current.save_plan("plan-b", plan_document("b"))
    assert len(tries) == (1 if committed else 2)  # a lost answer's plan is found, not saved again
    assert stored_plans(store) == [("plan-a", "SUPERSEDED"), ("plan-b", "ACTIVE")]
    active = current.active_plan()
    assert active is not None
    assert active.document == plan_document("b")


def test_a_plan_whose_save_is_cut_between_its_two_statements_is_saved_whole_when_tried_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save supersedes the active plan, then inserts the new one: the cut lands after
    the first statement committed, so the run had no active plan when it was tried again."""
    record(store)
    current = attempt(store, "w1:1")
    current.save_plan("plan-a", plan_document("a"))
    real = Store.execute
    cuts: list[str] = []

    def execute(self: Store, sql: str, params: Any, **kwargs: Any) -> Any:
        if "INSERT INTO celery_deadlines_runplan" in sql and not cuts:
            cuts.append(sql)
            raise OperationalError(CUT)
        return real(self, sql, params, **kwargs)

    monkeypatch.setattr(Store, "execute", execute)
    current.save_plan("plan-b", plan_document("b"))
    assert len(cuts) == 1
    assert stored_plans(store) == [("plan-a", "SUPERSEDED"), ("plan-b", "ACTIVE")]


@pytest.mark.parametrize("committed", [False, True], ids=["cut-before", "answer-lost"])
def test_a_plan_invalidated_through_a_cut_is_retired_once_and_the_attempt_goes_on(
    store: Store, monkeypatch: pytest.MonkeyPatch, committed: bool
) -> None:
    record(store)
    current = attempt(store, "w1:1")
    current.save_plan("plan-a", plan_document("a"))
    cut(monkeypatch, "active", of=Plans)  # the read of the plan meets the cut too
    active = current.active_plan()
    assert active is not None
    tries = cut(monkeypatch, "invalidate", committed=committed, of=Plans)
    current.invalidate_plan(active.row_id, "assumption_changed", "the order shipped")
    assert len(tries) == (1 if committed else 2)
    plan = RunPlan.objects.using(store.using).get()
    assert (plan.state, plan.reason) == ("INVALIDATED", "assumption_changed")
    assert not current.lost
    rejected = RunEvent.objects.using(store.using).filter(outcome="rejected")
    assert list(rejected.values_list("kind", flat=True)) == []


def test_the_ledgers_clock_an_observation_is_stamped_with_is_read_once_the_database_is_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(store)
    current = attempt(store, "w1:1")
    before = store.database_now()
    tries = cut(monkeypatch, "database_now", times=2, of=Store)
    read = current.database_now()
    assert len(tries) == 3
    assert read >= before


def test_a_write_waits_for_the_database_no_longer_than_the_runs_deadline(
    store: Store, monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    """The lease is 30 s, the deadline 12 s away on the attempt's monotonic clock: the
    write is given up once the deadline has passed (the lease ends there too)."""
    record(store)
    current = attempt(store, "w1:1")
    current.deadline_at = clock.monotonic() + 12
    tries = cut(monkeypatch, "checkpoint", times=999, clock=clock, of=Runs)
    with pytest.raises(StaleLease, match="until the run's deadline passed"):
        current.checkpoint("paid", {"payment": "P-1"})
    # tries at 0, 5 and 10 s of the cut; the next would be past the deadline
    assert len(tries) == 3
    assert current.lost
