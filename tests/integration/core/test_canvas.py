"""The workflow gate against a real Redis broker and a real ``celery worker``: a chain,
group or chord that cannot fit its deadline is refused whole, and not one message of it
reaches the queue; one that fits runs through a worker as Celery runs it."""

from __future__ import annotations

from typing import Any

import pytest
import redis as redis_py
from celery import chain, chord, group

from celery_deadlines import WorkflowRefused
from tests.integration.conftest import REDIS_BROKER
from tests.support.processes import Transport

pytestmark = pytest.mark.integration


def waiting_in(queue: str) -> int:
    """Messages waiting in ``queue`` on the broker (every priority list of it) or held
    unacknowledged for it."""
    with redis_py.Redis.from_url(REDIS_BROKER) as client:
        waiting = sum(int(client.llen(key)) for key in client.keys(f"{queue}*"))
        unacked = [value for value in client.hvals("unacked") if queue.encode() in value]
        return waiting + len(unacked)


def test_a_workflow_that_cannot_fit_publishes_nothing_and_one_that_fits_runs(
    redis: Transport, redis_client: Any, queue: str, start_worker: Any
) -> None:
    from tests.support.workerapp import collect, probe

    def step(label: str, timeout: float) -> Any:
        return probe.signature((label,), immutable=True, time_limit=timeout)

    # no worker yet: whatever were published would still be waiting in the queue
    too_long = [
        chain(step("a", 20), step("b", 20)),
        group(step("a", 20), step("b", 20) | step("c", 20)),
        chord([step("a", 20), step("b", 5)], collect.signature(time_limit=20)),
    ]
    for workflow in too_long:
        with pytest.raises(WorkflowRefused) as refused:
            workflow.apply_async(budget=30)
        assert refused.value.reason == "workflow_cannot_fit"
        assert "but 30.000 s left" in refused.value.detail
    assert waiting_in(queue) == 0

    start_worker(redis)
    result: Any = chain(step("a", 5), step("b", 5), step("c", 5)).apply_async(budget=30)
    last = result.get(timeout=30)
    first = result.parent.parent.get(timeout=5)
    assert [first["label"], last["label"]] == ["a", "c"]
    assert last["deadline"] == first["deadline"]  # one deadline for the whole chain
    # a chord whose body is a chain: the header task that completes it publishes the body
    # (a later hop of the workflow, checked at the enqueue only)
    body = chain(collect.signature(time_limit=5), step("after", 5))
    finished = chord([step("x", 5), step("y", 5)], body).apply_async(budget=30)
    assert finished.get(timeout=30)["label"] == "after"
    assert waiting_in(queue) == 0
