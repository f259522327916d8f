"""Where no deadline is involved, DeadlineTask behaves as ``celery.Task``.

Eagerly (``.apply()``, ``task_always_eager``) and in a pool process that Celery's worker
optimizations did not set up (``celery.contrib.testing.worker.start_worker``), Celery's
tracer calls a task class's own ``__call__``: the request it pushed must be the one the
body sees, and nothing of this library's may show on it (Celery copies a request's
attributes into its ``headers`` when a second one is pushed, and ``retry()`` publishes
those). Each behaviour is checked against plain ``celery.Task`` on the same app. Celery's
own task, trace and canvas tests run with DeadlineTask as the default task class in
``make celery-compat`` (compat/celery_compat.py).
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any
from unittest.mock import patch

import pytest
from celery import Celery, Task
from celery.app.trace import build_tracer

from celery_deadlines import DEADLINE_HEADER, DeadlineTask
from celery_deadlines.rules.wire import encode
from celery_deadlines.testing import FakeClock
from tests.support.unit_tasks import make_task

BASES = [pytest.param(Task, id="celery.Task"), pytest.param(DeadlineTask, id="DeadlineTask")]


def looking(app: Celery, base: type[Task], name: str = "parity.look") -> Any:  # type: ignore[type-arg]
    """A task whose body reports the request it sees (what does not vary between runs)."""

    @app.task(base=base, bind=True, shared=False, name=name)
    def look(self: Task, *args: Any) -> dict[str, Any]:  # type: ignore[type-arg]
        request = self.request
        return {
            "depth": len(self.request_stack),
            "headers": request.headers,
            "attributes": sorted(vars(request)),
            "args": list(request.args or ()),
            "retries": request.retries,
        }

    return look


def retrying(app: Celery, base: type[Task]) -> Any:  # type: ignore[type-arg]
    """A task that retries its first attempt, and reports its second one's request."""

    name = f"parity.retry.{base.__name__}"

    @app.task(base=base, bind=True, shared=False, name=name, default_retry_delay=0)
    def retry_once(self: Task) -> dict[str, Any]:  # type: ignore[type-arg]
        if self.request.retries == 0:
            self.retry()
        return {"headers": self.request.headers, "attributes": sorted(vars(self.request))}

    return retry_once


def private(found: object) -> list[str]:
    """Names of this library's private state in a mapping of request attributes or
    headers (``celery_deadlines``, ``celery_deadlines_anchor``... in earlier versions)."""
    if not isinstance(found, dict):
        return []
    return [key for key in found if str(key).startswith("celery_deadlines")]


def in_pool_process(app: Celery, task: Any, task_id: str = "w-1") -> Any:
    """Run ``task`` as a pool process of a worker does (Celery's tracer, not eager), for
    a message without headers of its own; returns the body's return value."""
    request = {
        "id": task_id,
        "task": task.name,
        "retries": 0,
        "is_eager": False,
        "hostname": "w1@test",
        "delivery_info": {"exchange": "", "routing_key": "celery"},
        "args": (),
        "kwargs": {},
    }
    tracer = build_tracer(task.name, task, eager=False, app=app, hostname="w1@test")
    return tracer(task_id, [], {}, request).retval


# -- one request per attempt ---------------------------------------------------------------


def test_an_eager_apply_pushes_the_request_once(app: Celery) -> None:
    task = looking(app, DeadlineTask)
    with patch.object(task.request_stack, "push", wraps=task.request_stack.push) as push:
        seen = task.apply(args=(1,)).get()
    push.assert_called_once()
    assert seen["depth"] == 1


def test_a_pool_process_without_worker_optimizations_pushes_the_request_once(
    app: Celery,
) -> None:
    task = looking(app, DeadlineTask)
    with patch.object(task.request_stack, "push", wraps=task.request_stack.push) as push:
        seen = in_pool_process(app, task)
    push.assert_called_once()
    assert seen["depth"] == 1


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({}, id="no-headers"),
        pytest.param({"headers": {"tenant": "a"}}, id="headers-of-its-own"),
        pytest.param({"headers": 123}, id="headers-not-a-mapping"),
    ],
)
def test_the_request_of_an_eager_attempt_is_the_one_celery_task_gets(
    app: Celery, options: dict[str, Any]
) -> None:
    seen = {
        base: looking(app, base, f"parity.{base.__name__}").apply((1,), **options).get()
        for base in (Task, DeadlineTask)
    }
    assert seen[DeadlineTask] == seen[Task]
    assert seen[DeadlineTask]["headers"] == options.get("headers")


def test_a_body_calling_its_own_task_directly_stays_in_its_attempt(
    app: Celery, clock: FakeClock
) -> None:
    @app.task(base=DeadlineTask, bind=True, shared=False, name="parity.nested")
    def nested(self: DeadlineTask, depth: int) -> tuple[float, int, bool]:
        if depth:
            result: tuple[float, int, bool] = self(depth - 1)
            return result
        return self.remaining(), len(self.request_stack), self.request.called_directly

    headers: dict[str, Any] = {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=10))}
    # as celery.Task: the direct call pushes its own request, a copy of the attempt's
    assert nested.apply((1,), headers=headers).get() == (10.0, 2, False)


# -- nothing private on the request, nor in what a retry publishes -------------------------


@pytest.mark.parametrize("base", BASES)
def test_an_eager_attempt_shows_no_private_state_on_its_request(
    app: Celery,
    base: type[Task],  # type: ignore[type-arg]
) -> None:
    seen = looking(app, base).apply((1,)).get()
    assert seen["headers"] is None
    assert private(dict.fromkeys(seen["attributes"])) == []


def test_an_eager_retry_carries_no_private_state_to_the_next_attempt(app: Celery) -> None:
    seen = {base: retrying(app, base).apply().get() for base in (Task, DeadlineTask)}
    assert seen[DeadlineTask] == seen[Task]
    assert private(seen[DeadlineTask]["headers"]) == []


@pytest.mark.parametrize("base", BASES)
def test_a_retry_in_a_pool_process_publishes_no_private_state(
    app: Celery,
    published: list[dict[str, Any]],
    base: type[Task],  # type: ignore[type-arg]
) -> None:
    in_pool_process(app, retrying(app, base))
    (retry,) = published
    assert private(retry) == []
    assert retry["retries"] == 1


def test_a_retry_publishes_the_same_headers_from_both_task_classes(
    app: Celery, published: list[dict[str, Any]]
) -> None:
    for base in (Task, DeadlineTask):
        in_pool_process(app, retrying(app, base), task_id="w-same")
    plain, deadline = published
    assert sorted(deadline) == sorted(plain)


# -- headers that are not a mapping ----------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [None, 123, "x_deadline", [(DEADLINE_HEADER, 1.0)], ()],
    ids=["none", "int", "str", "list-of-pairs", "empty-tuple"],
)
def test_before_start_reads_no_deadline_from_headers_that_are_not_a_mapping(
    app: Celery, headers: object
) -> None:
    task = make_task(app)
    task.push_request(id="t-1", headers=headers, retries=0, called_directly=False)
    task.before_start("t-1", (), {})
    assert task.deadline is None
    assert task.remaining() == math.inf
    assert task.request.headers == headers  # kept as Celery keeps them


def test_a_child_of_a_plain_task_whose_headers_are_not_a_mapping_inherits_nothing(
    app: Celery, published: list[dict[str, Any]]
) -> None:
    child = make_task(app, "parity.child")

    @app.task(bind=True, shared=False, name="parity.parent")
    def parent(self: Task) -> None:  # type: ignore[type-arg]
        child.apply_async()

    parent.apply(headers=123).get()  # type: ignore[arg-type]  # not a mapping, on purpose
    assert DEADLINE_HEADER not in published[-1]
