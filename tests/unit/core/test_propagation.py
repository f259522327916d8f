"""How a deadline reaches every message, on a fake clock and the memory broker: scopes,
a child published from an attempt, ``send_task`` by name through the publish hook."""

from __future__ import annotations

import logging
import threading
import types
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from celery._state import (  # type: ignore[attr-defined]
    pop_current_task,
    push_current_task,
)

from celery_deadlines import (
    DEADLINE_HEADER,
    ORIGIN_HEADER,
    SOURCE_HEADER,
    deadline_scope,
)
from celery_deadlines.core.propagation import current_task, headers_of
from celery_deadlines.rules.wire import encode
from celery_deadlines.testing import FakeClock
from tests.support.unit_tasks import make_task, start_attempt

# -- scopes: one deadline computed once outside a worker --------------------------------


def test_everything_published_in_a_scope_shares_one_deadline(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    task = make_task(app)

    @app.task(name="unit.plain", shared=False)
    def plain() -> None:
        return None

    with deadline_scope(budget=20, app=app):
        task.delay()
        clock.advance(3)
        task.delay()
        plain.delay()
    deadlines = {headers[DEADLINE_HEADER] for headers in published}
    assert deadlines == {encode(clock.now() - timedelta(seconds=3) + timedelta(seconds=20))}
    assert {headers[SOURCE_HEADER] for headers in published} == {"scope"}


def test_a_later_explicit_budget_inside_a_scope_is_clamped_and_logged(
    app: Celery,
    clock: FakeClock,
    published: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        caplog.at_level(logging.INFO, logger="celery_deadlines"),
        deadline_scope(budget=10, app=app),
    ):
        make_task(app).apply_async(budget=60)
    assert published[-1][DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=10))
    assert "clamped to the inherited" in caplog.text


def test_an_earlier_explicit_budget_inside_a_scope_is_kept(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    with deadline_scope(budget=10, app=app):
        make_task(app).apply_async(budget=2)
    assert published[-1][DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=2))
    assert published[-1][SOURCE_HEADER] == "call"


def test_send_task_by_name_takes_budget_from_the_call(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    make_task(app)  # binds DeadlineTask, which installs the publish hook
    app.send_task("somewhere.else", budget=15)
    assert published[-1][DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=15))
    assert published[-1]["expires"] == (clock.now() + timedelta(seconds=15)).isoformat()


def test_send_task_with_a_bad_budget_carries_an_unreadable_deadline_not_none(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    make_task(app)
    app.send_task("somewhere.else", budget=-4)
    assert published[-1][DEADLINE_HEADER] == "budget must be more than zero seconds, got -4"


def test_a_child_published_during_an_attempt_inherits_the_deadline(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    from celery._state import _task_stack  # type: ignore[attr-defined]

    parent = make_task(app, name="unit.parent")
    child = make_task(app, name="unit.child", budget=600)
    deadline = clock.now() + timedelta(seconds=10)
    start_attempt(parent, {DEADLINE_HEADER: encode(deadline), ORIGIN_HEADER: "root-1"})
    _task_stack.push(parent)
    try:
        clock.advance(1)
        child.delay()
    finally:
        _task_stack.pop()
    assert published[-1][DEADLINE_HEADER] == encode(deadline)
    assert published[-1][SOURCE_HEADER] == "parent"
    assert published[-1][ORIGIN_HEADER] == "root-1"


def test_a_scope_inside_a_running_task_can_only_shorten_the_tasks_deadline(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    from celery._state import _task_stack  # type: ignore[attr-defined]

    parent = make_task(app, name="unit.parent")
    child = make_task(app, name="unit.child")
    deadline = clock.now() + timedelta(seconds=10)
    start_attempt(parent, {DEADLINE_HEADER: encode(deadline)})
    _task_stack.push(parent)
    try:
        with deadline_scope(budget=5, app=app):
            child.delay()
        with deadline_scope(budget=60, app=app):
            child.delay()
    finally:
        _task_stack.pop()
    shorter, longer = published[-2:]
    assert (shorter[DEADLINE_HEADER], shorter[SOURCE_HEADER]) == (
        encode(clock.now() + timedelta(seconds=5)),
        "scope",
    )
    assert (longer[DEADLINE_HEADER], longer[SOURCE_HEADER]) == (encode(deadline), "parent")


# -- forged headers: a publisher writes what it likes, the inherited deadline still rules --


def _forged(clock: FakeClock, seconds: float = 3600, source: str = "call") -> dict[str, Any]:
    return {
        DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=seconds)),
        SOURCE_HEADER: source,
    }


@pytest.mark.parametrize("source", ["call", "parent", "scope", "not a source"])
def test_send_task_with_forged_deadline_headers_inside_a_scope_is_clamped_to_the_scope(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]], source: str
) -> None:
    make_task(app)  # installs the publish hook
    with deadline_scope(budget=2, app=app):
        app.send_task("somewhere.else", headers=_forged(clock, source=source))
    assert published[-1][DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=2))
    assert published[-1][SOURCE_HEADER] == "scope"
    assert published[-1]["expires"] == (clock.now() + timedelta(seconds=2)).isoformat()


def test_send_task_with_forged_deadline_headers_from_a_running_task_is_clamped_to_its_deadline(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    from celery._state import _task_stack  # type: ignore[attr-defined]

    parent = make_task(app, name="unit.parent")
    deadline = clock.now() + timedelta(seconds=2)
    start_attempt(parent, {DEADLINE_HEADER: encode(deadline)})
    _task_stack.push(parent)
    try:
        app.send_task("somewhere.else", headers=_forged(clock))
        make_task(app, name="unit.child").apply_async(headers=_forged(clock))
    finally:
        _task_stack.pop()
    by_name, by_task = published[-2:]
    assert (by_name[DEADLINE_HEADER], by_name[SOURCE_HEADER]) == (encode(deadline), "parent")
    assert (by_task[DEADLINE_HEADER], by_task[SOURCE_HEADER]) == (encode(deadline), "parent")


def test_a_forged_earlier_deadline_header_inside_a_scope_is_kept(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    make_task(app)
    with deadline_scope(budget=20, app=app):
        app.send_task("somewhere.else", headers=_forged(clock, seconds=5))
    assert published[-1][DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=5))


def test_a_forged_delivery_deadline_cannot_outlive_the_inherited_one(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    make_task(app)
    later = encode(clock.now() + timedelta(seconds=3600))
    with deadline_scope(delivery_budget=30, app=app):
        app.send_task("somewhere.else", headers={"x_delivery_deadline": later})
        app.send_task("somewhere.else", headers={"x_delivery_deadline": "garbage"})
    for headers in published[-2:]:
        assert headers["x_delivery_deadline"] == encode(clock.now() + timedelta(seconds=30))


def test_a_child_cannot_escape_an_unreadable_parent_deadline_by_naming_its_own(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    from celery._state import _task_stack  # type: ignore[attr-defined]

    parent = make_task(app, name="unit.parent")
    parent.push_request(id="t-1", headers={DEADLINE_HEADER: "garbage"}, called_directly=False)
    _task_stack.push(parent)
    try:
        app.send_task("somewhere.else", headers=_forged(clock))
        app.send_task("somewhere.else", budget=5)
    finally:
        _task_stack.pop()
    assert [headers[DEADLINE_HEADER] for headers in published[-2:]] == ["garbage", "garbage"]
    assert all(SOURCE_HEADER not in headers for headers in published[-2:])


@pytest.mark.parametrize(
    ("headers", "read"),
    [
        (None, {}),
        ("not a mapping", {}),
        (types.MappingProxyType({"x_deadline": 1.0}), {"x_deadline": 1.0}),
    ],
)
def test_a_requests_headers_are_read_as_a_mapping_whatever_the_caller_gave(
    headers: object, read: dict[str, object]
) -> None:
    assert headers_of(types.SimpleNamespace(headers=headers)) == read


def test_a_requests_own_header_dict_is_the_one_read_not_a_copy() -> None:
    headers: dict[str, object] = {"x_deadline": 1.0}
    assert headers_of(types.SimpleNamespace(headers=headers)) is headers


def test_the_running_task_is_the_one_on_this_threads_stack_and_none_without_one(
    app: Celery,
) -> None:
    task = make_task(app)
    assert current_task() is None
    push_current_task(task)
    try:
        assert current_task() is task
        elsewhere: list[Any] = []
        thread = threading.Thread(target=lambda: elsewhere.append(current_task()))
        thread.start()
        thread.join()
        assert elsewhere == [None]  # another thread runs no task
    finally:
        pop_current_task()
    assert current_task() is None


def test_a_plain_child_whose_expires_is_earlier_than_the_scope_carries_it_as_its_deadline(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    make_task(app)  # installs the publish hook
    with deadline_scope(budget=10, app=app):  # Celery turns seconds into an instant by
        # its own clock, not the fake one: the test gives instants
        app.send_task("somewhere.else", expires=clock.now() + timedelta(seconds=4))
        app.send_task("somewhere.else", expires=clock.now() + timedelta(seconds=40))
    shortened, later = published[-2:]
    assert shortened[DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=4))
    assert shortened[SOURCE_HEADER] == "expires"
    assert later[DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=10))
    assert later["expires"] == (clock.now() + timedelta(seconds=10)).isoformat()


def test_a_state_begun_in_seconds_holds_what_its_constructor_would_in_every_slot() -> None:
    from celery_deadlines.core.propagation import AttemptState, begin_in_time, state_of

    request = types.SimpleNamespace(id="t-1")
    headers = {"x_deadline": 1.5}
    begun = begin_in_time(request, headers, 1.5, 1.0, 7.0, timedelta(hours=1))
    made = AttemptState(None, headers, "t-1", 1.5, 1.0, 7.0, timedelta(hours=1))
    assert state_of(request) is begun
    assert {slot: getattr(begun, slot) for slot in AttemptState.__slots__} == {
        slot: getattr(made, slot) for slot in AttemptState.__slots__
    }
