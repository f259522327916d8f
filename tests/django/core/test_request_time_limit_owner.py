"""The worker's main process ends an attempt its hard time limit stopped, whatever pool
ran it: on the thread and greenlet pools the pid Celery reports for a job is a thread's
or greenlet's id, while the attempt's claim, made in the worker's own process, named
that process's pid. The ledger's own statements on SQLite; Celery's request as the
worker's main process makes it (celery_deadlines.request, celery_deadlines.pools)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace

import pytest
from celery import Celery

from celery_deadlines import DEADLINE_HEADER
from celery_deadlines.core import pools
from celery_deadlines.ledger.attempt import owner_name
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.models import Run, RunEvent, Status
from celery_deadlines.rules.records import Lease
from celery_deadlines.rules.wire import encode
from tests.django.core.test_effects import record
from tests.support.unit_tasks import claim, make_task

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

#: The id Celery's gevent pool reports for a job: ``id(greenlet)``, not a pid.
GREENLET_ID = 140_234_567_890_123


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("owner", broker="memory://", backend="cache+memory://")
    app.conf.update(deadlines_ledger=True, deadlines_database="default")
    yield app
    app.close()


@pytest.fixture
def in_process_pool(monkeypatch: pytest.MonkeyPatch) -> str:
    """A worker of Celery's gevent pool, as worker_init tells the library (restored
    after: a process does not change pools)."""
    for flag in ("_one_at_a_time", "_attempts_here"):
        monkeypatch.setattr(pools, flag, False, raising=False)
    pools._in_a_worker(sender=SimpleNamespace(pool_cls="gevent"))
    return "gevent"


@pytest.mark.usefixtures("in_process_pool")
def test_a_green_pools_attempt_stopped_by_its_hard_limit_is_ended_by_the_worker(
    app: Celery,
) -> None:
    store = Store("default")
    record(store, deadline_in=600)
    task = make_task(app, "shop.charge", time_limit=1)
    deadline = Run.objects.get(task_id="charge-1").deadline
    assert deadline is not None
    request, _ = claim(app, task, {DEADLINE_HEADER: encode(deadline)}, task_id="charge-1")
    request.time_limits  # noqa: B018 - read by Celery as it hands the job to the pool
    # the job's claim, made in this process (a greenlet of the worker's main process)
    lease = store.runs.claim(
        "charge-1",
        0,
        task_name="shop.charge",
        owner=owner_name(request.hostname),
        ttl=timedelta(seconds=30),
        reserve=timedelta(0),
        max_lost_leases=10,
    )
    assert isinstance(lease, Lease)
    request.worker_pid = GREENLET_ID  # type: ignore[assignment]  # gevent's accept callback
    request.on_timeout(False, 1.0)  # gevent's Timeout: the task's own hard limit
    run = Run.objects.get(task_id="charge-1")
    assert (run.status, run.reason) == (Status.FAILED, "time_limit")
    ended = RunEvent.objects.get(run=run, kind="end_owned")
    assert (ended.outcome, ended.owner) == ("applied", owner_name(request.hostname))
