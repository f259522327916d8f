"""The ledger against a model of it: random sequences of claims, writes, lapses and
reconciliation by several workers (hypothesis stateful testing, reliability plan S13).

After every step the database must agree with the model: the run's status and fencing
token, exactly the writes the model allows succeeding (a worker's write lands only with
the current token and a live lease), tokens only ever growing, and a final run never
changing again. A failing sequence is shrunk and printed with its seed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.ledger.sql.rows import ClaimRefused, Lease, NewRun
from celery_deadlines.models import TERMINAL, Run, RunEvent, Status
from tests.conftest import service_unavailable
from tests.django.conftest import DATABASES
from tests.support.processes import reachable

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgres"])

WORKERS = ("w1:1", "w2:2", "w3:3")
TTL = timedelta(seconds=30)
_ids = itertools.count()


@dataclass
class Model:
    """What the ledger should hold for one run."""

    status: str = Status.QUEUED
    token: int = 0
    live: bool = False  # is the current lease alive (by the database clock)?
    leases: dict[str, Lease] = field(default_factory=dict)  # what each worker holds


def machine_for(store: Store) -> type[RuleBasedStateMachine]:
    class LedgerMachine(RuleBasedStateMachine):
        runs = Bundle("runs")

        def __init__(self) -> None:
            super().__init__()
            self.model: dict[str, Model] = {}

        @rule(target=runs)
        def enqueue(self) -> str:
            task_id = f"model-{next(_ids)}"
            run = NewRun(
                task_id=task_id,
                task_name="t",
                root_id=task_id,
                message_body=b"{}",
                content_type="",
                content_encoding="",
            )
            assert store.outbox.enqueue(run)
            self.model[task_id] = Model()
            return task_id

        @rule(task_id=runs, worker=st.sampled_from(WORKERS))
        def claim(self, task_id: str, worker: str) -> None:
            model = self.model[task_id]
            outcome = store.runs.claim(
                task_id,
                0,
                task_name="t",
                owner=worker,
                ttl=TTL,
                reserve=timedelta(0),
                max_lost_leases=1000,
            )
            claimable = model.status in (Status.QUEUED, Status.RETRYING) or (
                model.status == Status.RUNNING and not model.live
            )
            if not claimable:
                assert isinstance(outcome, ClaimRefused), (model, outcome)
                return
            assert isinstance(outcome, Lease), (model, outcome)
            assert outcome.token == model.token + 1
            model.status, model.token, model.live = Status.RUNNING, outcome.token, True
            model.leases[worker] = outcome

        @rule(task_id=runs)
        def lease_lapses(self, task_id: str) -> None:
            model = self.model[task_id]
            if model.status != Status.RUNNING:
                return
            Run.objects.using(store.using).filter(task_id=task_id).update(
                lease_expires_at=store.database_now() - timedelta(seconds=2), op="age"
            )
            model.live = False

        @rule(
            task_id=runs,
            worker=st.sampled_from(WORKERS),
            write=st.sampled_from(["checkpoint", "succeed", "fail", "retry"]),
        )
        def write(self, task_id: str, worker: str, write: str) -> None:
            model = self.model[task_id]
            lease = model.leases.get(worker)
            if lease is None:
                return
            allowed = model.status == Status.RUNNING and model.live and lease.token == model.token
            if write == "checkpoint":
                done = store.runs.checkpoint(lease, worker, "step", {"by": worker})
            elif write == "succeed":
                done = store.runs.finish(lease, worker, Status.SUCCEEDED)
            elif write == "fail":
                done = store.runs.finish(lease, worker, Status.FAILED, "error", "boom")
            else:
                done = store.runs.retry(
                    lease, worker, retries=0, available_at=None, message_body=b"{}", detail="retry"
                )
            assert done == allowed, (write, worker, lease.token, model)
            if done and write in ("succeed", "fail"):
                model.status = Status.SUCCEEDED if write == "succeed" else Status.FAILED
                model.live = False
            elif done and write == "retry":
                model.status, model.live = Status.RETRYING, False

        @rule()
        def reconcile(self) -> None:
            for lapsed in store.sweeps.lapsed_leases(limit=1000):
                model = self.model.get(lapsed.task_id)
                if model is None:
                    continue  # another example's run
                assert model.status == Status.RUNNING
                assert not model.live
                assert store.sweeps.requeue_lapsed(lapsed)
                model.status, model.token = Status.QUEUED, model.token + 1

        @invariant()
        def the_database_agrees_with_the_model(self) -> None:
            for task_id, model in self.model.items():
                run = Run.objects.using(store.using).get(task_id=task_id)
                assert (run.status, run.lease_token) == (model.status, model.token), task_id

        @invariant()
        def claims_only_ever_raise_the_token(self) -> None:
            for task_id in self.model:
                tokens = list(
                    RunEvent.objects.using(store.using)
                    .filter(run__task_id=task_id, kind="claim", outcome="applied")
                    .values_list("lease_token", flat=True)
                )
                assert tokens == sorted(set(tokens)), (task_id, tokens)

        @invariant()
        def a_final_run_is_never_written_again(self) -> None:
            for task_id, model in self.model.items():
                if model.status in TERMINAL:
                    run = Run.objects.using(store.using).get(task_id=task_id)
                    last = run.events.filter(outcome="applied").last()
                    assert last is not None
                    assert last.kind in ("succeeded", "failed"), (task_id, last.kind)

    return LedgerMachine


@pytest.mark.parametrize("alias", DATABASES)
def test_the_ledger_behaves_like_its_model_under_random_claims_writes_and_lapses(
    alias: str,
) -> None:
    if alias == "postgres" and not reachable("127.0.0.1", 5432):
        service_unavailable("PostgreSQL 127.0.0.1:5432")
    run_state_machine_as_test(
        machine_for(Store(alias)),
        settings=settings(
            max_examples=40,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
