"""Celery's in-process test worker (``celery.contrib.testing``), on a real Redis broker.

pytest-celery's Docker-based fixtures cannot run on machines without a Docker engine;
its legacy fixtures wrap this same in-process worker. It lets a test observe what only
the worker process sees, such as the ``deadline_refused`` signal sent at claim time.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_deadlines import DeadlineRefused, DeadlineTask, deadline_refused
from celery_deadlines.gates import Decision
from tests.conftest import service_unavailable
from tests.support.processes import reachable

pytestmark = pytest.mark.integration


@pytest.fixture
def app() -> Iterator[Celery]:
    if not reachable("127.0.0.1", 6379):
        service_unavailable("Redis 127.0.0.1:6379")
    app = Celery(
        "inprocess",
        broker="redis://127.0.0.1:6379/8",
        backend="redis://127.0.0.1:6379/8",
        set_as_current=False,
    )
    app.conf.task_default_queue = f"inproc-{uuid.uuid4().hex[:8]}"
    app.conf.broker_connection_retry_on_startup = True
    yield app
    app.close()


def test_the_worker_sends_deadline_refused_for_a_message_it_will_not_claim(app: Celery) -> None:
    @app.task(base=DeadlineTask, bind=True, name="inproc.work", shared=False)
    def work(self: DeadlineTask) -> float:
        return self.remaining()

    seen: list[tuple[str, Decision]] = []

    def observe(task_id: str, decision: Decision, **_: Any) -> None:
        seen.append((task_id, decision))

    deadline_refused.connect(observe, weak=False)
    try:
        late = work.apply_async(budget=0.3)
        time.sleep(0.5)
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            with pytest.raises(DeadlineRefused, match="deadline_passed"):
                late.get(timeout=10)
            on_time = work.apply_async(budget=30)
            assert 0 < on_time.get(timeout=10) <= 30
    finally:
        deadline_refused.disconnect(observe)
    assert [(task_id, decision.gate, decision.reason) for task_id, decision in seen] == [
        (late.id, "claim", "deadline_passed")
    ]
