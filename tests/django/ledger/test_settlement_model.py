"""Settling effects against a model: two reconcilers and an operator acting concurrently.

Hypothesis drives random interleavings of workers (an attempt claims and dispatches,
with or without the provider call; it records the reply, or dies), leases lapsing, and
three settlers that each
*read* (lapsed runs, unresolved effects, and the provider's truthful answer at that
moment) and *act* at their next step on what they read then: two reconcilers and an
operator with the admin's form. Reading and acting apart is what real concurrency does
to them.

The provider's log is the oracle: a key is never called twice, an effect recorded as
not dispatched was never called, and one recorded as succeeded was. The soak once found
a stale settlement overwriting a newer dispatch (a payment made twice); here that is
a short sequence, shrunk and printed with its seed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from celery_deadlines.ledger.operations import release_settled, settle_effect
from celery_deadlines.ledger.reconcile import Report, _settle
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.ledger.sql.effects import Pending
from celery_deadlines.ledger.sql.rows import LapsedLease, Lease, NewRun
from celery_deadlines.models import Effect, EffectState, Run
from tests.conftest import service_unavailable
from tests.django.conftest import DATABASES
from tests.support.processes import reachable

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgres"])

WORKERS = ("w1:1", "w2:2")
SETTLERS = ("reconciler-1", "reconciler-2", "operator ops")
TTL = timedelta(seconds=30)
_ids = itertools.count()

app = Celery("settlement-model", broker="memory://", backend="cache+memory://")


@dataclass
class Worker:
    lease: Lease | None = None
    #: a dispatch whose provider call was made, its outcome not yet recorded
    in_flight: bool = False


@dataclass
class Settler:
    """What a reconciler or operator read, to act on later."""

    lapsed: list[LapsedLease] = field(default_factory=list)
    answers: list[tuple[Pending, bool]] = field(default_factory=list)


def machine_for(store: Store) -> type[RuleBasedStateMachine]:
    effects = store.effects

    class SettlementMachine(RuleBasedStateMachine):
        def idle(self) -> bool:
            return any(w.lease is None for w in self.workers.values())

        def in_flight(self) -> bool:
            return any(w.in_flight for w in self.workers.values())

        @initialize()
        def a_run_with_one_effect_key(self) -> None:
            n = next(_ids)
            self.task_id, self.key = f"settle-{n}", f"pay-settle-{n}"
            run = NewRun(
                task_id=self.task_id,
                task_name="t",
                root_id=self.task_id,
                message_body=b"{}",
            )
            assert store.outbox.enqueue(run)
            self.calls = 0  # the provider's log for the key
            self.workers = {name: Worker() for name in WORKERS}
            self.settlers = {name: Settler() for name in SETTLERS}

        @rule(worker=st.sampled_from(WORKERS), calls=st.booleans())
        @precondition(idle)
        def attempt(self, worker: str, calls: bool) -> None:
            """Claim the run and dispatch its effect; the provider is called (``calls``)
            or the worker dies after the guard, before the call."""
            if self.workers[worker].lease is not None:
                return
            lease = store.runs.claim(
                self.task_id,
                0,
                task_name="t",
                owner=worker,
                ttl=TTL,
                reserve=timedelta(0),
                max_lost_leases=1000,
            )
            if not isinstance(lease, Lease):
                return
            self.workers[worker] = Worker(lease)
            recorded = effects.record_intent(lease, self.key, "pay", "execution", "f")
            if recorded.state not in (EffectState.INTENT_RECORDED, EffectState.NOT_DISPATCHED):
                return  # replayed or unresolved: no call
            if effects.dispatch(lease, self.key) is None:
                return  # the guard refused: no call
            if calls:
                self.calls += 1
                self.workers[worker].in_flight = True
            else:
                self.dies(worker)

        @rule(worker=st.sampled_from(WORKERS))
        @precondition(in_flight)
        def record_the_reply(self, worker: str) -> None:
            held = self.workers[worker]
            if held.lease is not None and held.in_flight:
                effects.succeed(held.lease, self.key, {"paid": self.key})
                held.in_flight = False

        @rule(worker=st.sampled_from(WORKERS))
        def dies(self, worker: str) -> None:
            """The worker's process is gone: its lease lapses (as it will, after its TTL)."""
            if self.workers[worker].lease is not None:
                self.the_lease_lapses()
            self.workers[worker] = Worker()

        @rule()
        def the_lease_lapses(self) -> None:
            """The holder is paused past its lease (it may still act later)."""
            past = store.database_now() - timedelta(seconds=5)
            Run.objects.using(store.using).filter(task_id=self.task_id, status="RUNNING").update(
                lease_expires_at=past, op="age"
            )

        @rule(settler=st.sampled_from(SETTLERS))
        def settles(self, settler: str) -> None:
            """Act on what this settler read at its previous step, then read again: its
            view is always one step old, as a reconciler's is by the time it writes."""
            read = self.settlers[settler]
            for stale in read.lapsed:
                _settle(app, store, stale, 1000, Report())
            for seen, found in read.answers:
                result = {"paid": self.key} if found else None
                settle_effect(
                    app, store, seen, found=found, result=result, evidence="lookup", by=settler
                )
            for run_id, task_id, task_name in effects.settled_unknown(limit=1000):
                if task_id == self.task_id:
                    release_settled(app, store, run_id, task_id, task_name)
            mine = [p for p in effects.pending(limit=1000) if p.task_id == self.task_id]
            lapsed = [
                x for x in store.sweeps.lapsed_leases(limit=1000) if x.task_id == self.task_id
            ]
            # the provider's answer, true when it is given: found iff it has the call
            self.settlers[settler] = Settler(lapsed, [(p, self.calls > 0) for p in mine])

        @invariant()
        def the_provider_is_called_at_most_once_per_key(self) -> None:
            assert self.calls <= 1

        @invariant()
        def the_ledger_agrees_with_the_provider(self) -> None:
            effect = Effect.objects.using(store.using).filter(key=self.key).first()
            if effect is None:
                return
            if effect.state == EffectState.NOT_DISPATCHED:
                assert self.calls == 0, "settled as not sent, but the provider has the call"
            if effect.state == EffectState.SUCCEEDED:
                assert self.calls == 1, "recorded as done, but the provider has no call"

    return SettlementMachine


def _published(*_: Any, **__: Any) -> None:
    """The model checks the ledger; republished messages go nowhere."""


@pytest.mark.parametrize("alias", DATABASES)
def test_two_reconcilers_and_an_operator_never_settle_one_dispatch_twice(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    from celery_deadlines.ledger import outbox

    if alias == "postgres" and not reachable("127.0.0.1", 5432):
        service_unavailable("PostgreSQL 127.0.0.1:5432")
    monkeypatch.setattr(outbox, "republish", _published)
    monkeypatch.setattr(app.backend, "mark_as_failure", _published)
    run_state_machine_as_test(
        machine_for(Store(alias)),
        settings=settings(
            max_examples=150,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
