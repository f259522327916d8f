"""pytest-celery's in-process session worker, on a real Redis broker.

pytest-celery's Docker-based fixtures cannot run on machines without a Docker engine;
its session fixtures (``celery_session_app``, ``celery_session_worker``) run Celery's
in-process worker and can. It lets a test observe what only the worker process sees,
such as the ``deadline_refused`` signal sent when the claim gate refuses a message.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_deadlines import DeadlineRefused, deadline_refused
from celery_deadlines.rules.gates import Decision
from tests.conftest import service_unavailable
from tests.support import isolation
from tests.support.processes import reachable

#: One xdist worker runs this module: its worker is the session's (pytest-celery).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("inprocess")]

QUEUE = isolation.queue_name(f"inproc-{uuid.uuid4().hex[:8]}")


@pytest.fixture(scope="session")
def celery_config() -> dict[str, Any]:
    if not reachable("127.0.0.1", 6379):
        service_unavailable("Redis 127.0.0.1:6379")
    return {
        "broker_url": isolation.REDIS_INPROCESS,  # TEST_REDIS_INPROCESS_DB
        "result_backend": isolation.REDIS_INPROCESS,
        "task_default_queue": QUEUE,
        "broker_connection_retry_on_startup": True,
        "deadlines_ledger": False,  # the header tier (the ledger has real-worker tests)
    }


@pytest.fixture(scope="session")
def celery_includes() -> list[str]:
    return ["tests.support.inprocess_tasks"]


@pytest.fixture(scope="session")
def celery_worker_parameters() -> dict[str, Any]:
    return {"queues": [QUEUE], "perform_ping_check": False, "shutdown_timeout": 10}


@pytest.fixture
def refusals() -> Iterator[list[tuple[str, Decision]]]:
    seen: list[tuple[str, Decision]] = []

    def observe(task_id: str, decision: Decision, **_: Any) -> None:
        seen.append((task_id, decision))

    deadline_refused.connect(observe, weak=False)
    yield seen
    deadline_refused.disconnect(observe)


def test_the_worker_signals_a_refusal_of_a_message_that_waited_behind_a_busy_pool(
    celery_session_app: Celery,
    celery_session_worker: Any,
    refusals: list[tuple[str, Decision]],
) -> None:
    from tests.support.inprocess_tasks import busy, work

    # Given the worker's only slot busy for 1 s, and a message with 0.5 s to live behind it
    blocker = busy.delay(1.0)
    late = work.apply_async(budget=0.5)
    # When the slot frees, the claim gate refuses the message, and says so
    with pytest.raises(DeadlineRefused, match="deadline_passed"):
        late.get(timeout=10)
    assert blocker.get(timeout=10) == 1.0
    assert [(task_id, d.gate, d.reason) for task_id, d in refusals] == [
        (late.id, "claim", "deadline_passed")
    ]
    # and a message with time left still runs, with its budget counted down
    assert 0 < work.apply_async(budget=30).get(timeout=10) <= 30


def test_a_task_without_a_deadline_retries_under_start_worker_as_a_celery_task_does(
    celery_session_app: Celery, celery_session_worker: Any
) -> None:
    from tests.support.inprocess_tasks import retry_once

    # start_worker sets up none of the worker's optimizations: Celery's tracer calls
    # DeadlineTask.__call__, which must not push the request again (Celery would copy
    # the library's state into request.headers, and the retry's JSON message with it)
    assert retry_once.delay().get(timeout=10) == {"headers": [], "depth": 1, "retries": 1}
