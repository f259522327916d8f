"""The workflow gate keeps Celery's promise for a group (or a chord's header) given a
generator (celery#3021: Celery publishes the members as the generator yields them, one
member ahead): under a deadline or not, the gate reads no more of it than Celery does
before its first publish, judges the group by its first member, and each member is
judged by its own enqueue gate as it is published (memory broker, fake clock)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery, chord, group
from celery._state import _task_stack  # type: ignore[attr-defined]
from celery.signals import after_task_publish

from celery_deadlines import (
    DEADLINE_HEADER,
    SOURCE_HEADER,
    DeadlineRefused,
    DeadlineTask,
    WorkflowRefused,
    deadline_scope,
)
from celery_deadlines.core import canvas as gate
from celery_deadlines.rules.contracts import is_deadline_task
from celery_deadlines.rules.wire import encode
from celery_deadlines.testing import FakeClock
from tests.support.unit_tasks import start_attempt

Event = tuple[str, int]

#: What Celery 5.7's group does with a generator of three: the first two members are
#: read before the first publish (one member of look-ahead), the third after it.
CELERYS_ORDER: list[Event] = [
    ("pulled", 0),
    ("pulled", 1),
    ("published", 0),
    ("pulled", 2),
    ("published", 1),
    ("published", 2),
]
#: What the gate reads of a generator of three before its first publish: the first
#: member, and Celery's one member of look-ahead.
FIRST_READ: list[Event] = [("pulled", 0), ("pulled", 1)]


def make(app: Celery, name: str, **options: Any) -> Any:
    @app.task(base=DeadlineTask, name=name, shared=False, **options)
    def work(index: int) -> int:
        return index

    return work


def plain(index: int) -> int:
    return index


@pytest.fixture
def tasks(app: Celery, clock: FakeClock) -> dict[str, Any]:
    """DeadlineTasks bound to ``app`` (the gate is installed for the whole process)."""
    found = {
        "timed": make(app, "gen.timed", attempt_timeout=10),
        "budgeted": make(app, "gen.budgeted", attempt_timeout=10, budget=5),
        "bare": make(app, "gen.bare"),
        "plain": app.task(name="gen.plain", shared=False)(plain),
    }
    app.finalize()  # binds the DeadlineTasks: install() puts the gate in place
    assert gate.patched()
    return found


@pytest.fixture
def plain_app(tasks: dict[str, Any]) -> Iterator[Celery]:
    """A plain Celery app, no DeadlineTask in it, in the process where the gate is."""
    other = Celery("plain", broker="memory://", backend="cache+memory://", set_as_current=False)
    other.conf.deadlines_ledger = False
    other.task(name="plain.work", shared=False)(plain)
    other.finalize()
    # Celery registers every shared task on every app it finalizes: the DeadlineTasks
    # other test modules share would make this app one that has some
    for name in [name for name, task in other.tasks.items() if is_deadline_task(task)]:
        del other.tasks[name]
    yield other
    other.close()


@pytest.fixture
def events() -> Iterator[list[Event]]:
    """Each member pulled from a generator and each message published, in order."""
    seen: list[Event] = []

    def record(headers: dict[str, Any] | None = None, **_: Any) -> None:
        seen.append(("published", int(str((headers or {})["argsrepr"]).strip("(,)"))))

    after_task_publish.connect(record, weak=False)
    yield seen
    after_task_publish.disconnect(record)


def members(task: Any, events: list[Event], count: int = 3) -> Iterator[Any]:
    for index in range(count):
        events.append(("pulled", index))
        yield task.s(index)


def celerys_order(build: Callable[[], group], events: list[Event]) -> list[Event]:
    """The order Celery's own ``group.apply_async`` (the gate's wrapped method) gives."""
    assert gate.patched()
    celerys_own: Callable[..., Any] = group.apply_async.__wrapped__  # type: ignore[attr-defined]
    celerys_own(build())
    order = list(events)
    events.clear()
    return order


@contextmanager
def running_task_with_deadline(task: Any, clock: FakeClock, seconds: float) -> Iterator[None]:
    headers = {
        DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=seconds)),
        SOURCE_HEADER: "call",
    }
    start_attempt(task, headers)
    _task_stack.push(task)
    try:
        yield
    finally:
        _task_stack.pop()
        task.pop_request()


def a_deadline(
    kind: str, tasks: dict[str, Any], clock: FakeClock, seconds: float
) -> AbstractContextManager[Any]:
    if kind == "scope":
        return deadline_scope(budget=seconds)
    return running_task_with_deadline(tasks["bare"], clock, seconds)


def test_a_plain_apps_generator_is_consumed_as_celery_consumes_it(
    plain_app: Celery, events: list[Event]
) -> None:
    work = plain_app.tasks["plain.work"]
    assert celerys_order(lambda: group(members(work, events)), events) == CELERYS_ORDER
    group(members(work, events)).apply_async()
    assert events == CELERYS_ORDER


def test_a_plain_apps_generator_is_not_read_ahead_even_inside_a_deadline_scope(
    plain_app: Celery, events: list[Event]
) -> None:
    # no step of a plain app's canvas can be a DeadlineTask: there is nothing to judge
    work = plain_app.tasks["plain.work"]
    with deadline_scope(budget=30):
        group(members(work, events)).apply_async()
    assert events == CELERYS_ORDER


@pytest.mark.parametrize("name", ["timed", "bare", "plain"])
def test_a_generator_whose_first_step_gets_no_deadline_is_consumed_as_celery_consumes_it(
    tasks: dict[str, Any], events: list[Event], name: str
) -> None:
    task = tasks[name]
    assert celerys_order(lambda: group(members(task, events)), events) == CELERYS_ORDER
    group(members(task, events)).apply_async()
    assert events == CELERYS_ORDER


def test_a_later_members_budget_does_not_make_the_gate_read_ahead(
    tasks: dict[str, Any], events: list[Event]
) -> None:
    # the first step's deadline governs a group (none here); the budgeted member that
    # comes later is its own enqueue gate's to stamp
    timed, budgeted = tasks["timed"], tasks["budgeted"]

    def mixed() -> Iterator[Any]:
        for index, task in enumerate([timed, timed, budgeted]):
            events.append(("pulled", index))
            yield task.s(index)

    group(mixed()).apply_async()
    assert events == CELERYS_ORDER


@pytest.mark.parametrize("kind", ["scope", "running task"])
def test_under_a_deadline_a_generator_whose_first_member_cannot_fit_is_refused_unpublished(
    tasks: dict[str, Any], clock: FakeClock, events: list[Event], kind: str
) -> None:
    with a_deadline(kind, tasks, clock, 9), pytest.raises(WorkflowRefused) as refused:
        group(members(tasks["timed"], events)).apply_async()
    assert events == FIRST_READ  # nothing published, no member read past Celery's look-ahead
    assert "needs 10.000 s (gen.timed: attempt timeout 10.000 s) but 9.000 s left" in (
        refused.value.detail
    )


@pytest.mark.parametrize("kind", ["scope", "running task"])
def test_under_a_deadline_a_generator_is_published_as_it_yields_as_celery_publishes_it(
    tasks: dict[str, Any], clock: FakeClock, events: list[Event], kind: str
) -> None:
    with a_deadline(kind, tasks, clock, 10):
        group(members(tasks["timed"], events)).apply_async()
    assert events == CELERYS_ORDER


def test_a_chords_body_that_cannot_follow_its_generators_first_member_refuses_it_unpublished(
    tasks: dict[str, Any], clock: FakeClock, events: list[Event]
) -> None:
    # the part of the canvas the gate can see is judged whole: the header's first
    # member, then the body
    with deadline_scope(budget=15), pytest.raises(WorkflowRefused) as refused:
        chord(members(tasks["timed"], events), tasks["timed"].si(99)).apply_async()
    assert events == FIRST_READ
    assert "needs 20.000 s" in refused.value.detail


def test_a_generators_later_member_is_judged_by_its_own_enqueue_gate_as_it_is_published(
    tasks: dict[str, Any], clock: FakeClock, events: list[Event]
) -> None:
    # what the gate cannot read: a generator slow enough to outlive the deadline
    timed = tasks["timed"]

    def slow() -> Iterator[Any]:
        for index in range(3):
            if index == 2:
                clock.advance(11)  # the deadline passed while the generator worked
            events.append(("pulled", index))
            yield timed.s(index)

    with deadline_scope(budget=10), pytest.raises(DeadlineRefused) as refused:
        group(slow()).apply_async()
    assert (refused.value.gate, refused.value.reason) == ("enqueue", "deadline_passed")
    # the first was published; the second, published once the third was read, was refused
    assert events == CELERYS_ORDER[:4]


def test_a_generator_whose_first_member_has_a_budget_is_judged_against_it(
    tasks: dict[str, Any], events: list[Event]
) -> None:
    # the first step's budget is the governing deadline: the members are needed
    with pytest.raises(WorkflowRefused) as refused:
        group(members(tasks["budgeted"], events)).apply_async()
    assert events == FIRST_READ
    assert "but 5.000 s left" in refused.value.detail
