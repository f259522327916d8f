"""A cancel's hard limit, in the worker's main process (celery_deadlines.core.cancelling
and core.supervision): the broadcast a cancel sends is only a prompt, the ledger says
which runs were cancelled, and a body ended by its fallen limit is told ``REVOKED``. The
ledger's own statements on SQLite; Celery's requests as a worker's main process makes
them; a prefork pool's timer (JobLimits) on a fake event loop."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.worker import state as worker_state

from celery_deadlines import DEADLINE_HEADER
from celery_deadlines.core import cancelling, timelimits
from celery_deadlines.core.timelimits import JobLimits
from celery_deadlines.ledger.attempt import owner_name
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.models import Run, Status
from celery_deadlines.rules.records import Lease
from celery_deadlines.rules.wire import encode
from celery_deadlines.testing import FakeClock, use_clock
from tests.django.core.test_effects import record
from tests.support.unit_tasks import claim, make_task
from tests.unit.core.test_timelimits import Hub, Pool

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

LEASE = 30.0


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("cancels", broker="memory://", backend="cache+memory://")
    app.conf.update(deadlines_ledger=True, deadlines_database="default", deadlines_lease_ttl=LEASE)
    yield app
    app.close()


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    with use_clock(FakeClock(monotonic=100.0)) as fake:
        yield fake


class Running:
    """Runs claimed by a worker's main process, as active requests of a prefork pool
    whose jobs' limits one timer keeps."""

    def __init__(self, app: Celery, clock: FakeClock) -> None:
        self.app, self.store = app, Store("default")
        self.task = make_task(app, "shop.charge")
        self.hub, self.pool = Hub(clock), Pool(clock)
        self.limits = JobLimits(self.pool, self.hub)
        setattr(self.pool, timelimits._MARK, self.limits)
        self.state = SimpleNamespace(
            consumer=SimpleNamespace(app=app, pool=SimpleNamespace(_pool=self.pool))
        )
        self.requests: list[Any] = []

    def run(self, task_id: str, job: int) -> Any:
        record(self.store, task_id=task_id, deadline_in=600)
        deadline = Run.objects.get(task_id=task_id).deadline
        assert deadline is not None
        request, _ = claim(self.app, self.task, {DEADLINE_HEADER: encode(deadline)}, task_id)
        request.time_limits  # noqa: B018 - read by Celery as it hands the job to the pool
        lease = self.store.runs.claim(
            task_id,
            0,
            task_name="shop.charge",
            owner=owner_name(request.hostname),
            ttl=timedelta(seconds=LEASE),
            reserve=timedelta(0),
            max_lost_leases=10,
        )
        assert isinstance(lease, Lease)
        request.worker_pid = os.getpid()  # type: ignore[assignment]  # its pool process
        result = SimpleNamespace(_job=job)
        request._apply_result = lambda: result  # type: ignore[attr-defined]  # as Celery keeps it
        self.limits.on_timeout_set(result, None, 600.0)
        worker_state.active_requests.add(request)
        self.requests.append(request)
        return request

    def close(self) -> None:
        for request in self.requests:
            worker_state.active_requests.discard(request)


@pytest.fixture
def running(app: Celery, clock: FakeClock) -> Iterator[Running]:
    worker = Running(app, clock)
    yield worker
    worker.close()


def test_a_broadcast_nobody_cancelled_anything_for_shortens_no_limit(running: Running) -> None:
    running.run("charge-1", 1)
    assert cancelling.hard_limits_fall(running.state, task_ids=["charge-1"]) == {"fell": 0}
    assert running.limits.fallen == {}


def test_the_hard_limit_of_a_cancelled_run_alone_falls_to_one_lease(
    running: Running, app: Celery
) -> None:
    cancelled = running.run("charge-1", 1)
    other = running.run("charge-2", 2)
    assert cancelling.cancel("charge-1", reason="runaway", app=app) == 1

    assert cancelling.hard_limits_fall(running.state) == {"fell": 1}
    assert running.limits.fallen == {1: 100.0 + LEASE}
    assert getattr(cancelled, cancelling.FELL) is True
    assert not hasattr(other, cancelling.FELL)


def test_a_body_its_fallen_limit_ended_ends_its_run_cancelled_and_its_caller_is_told_revoked(
    running: Running, app: Celery
) -> None:
    request = running.run("charge-1", 1)
    cancelling.cancel("charge-1", reason="runaway", app=app)
    cancelling.hard_limits_fall(running.state)

    request.on_timeout(False, 600.0)  # the pool's hard limit, when it fell
    run = Run.objects.get(task_id="charge-1")
    assert (run.status, run.reason) == (Status.EXPIRED, "cancelled")
    state: str = app.AsyncResult("charge-1").state
    assert state == "REVOKED"
