"""The workflow gate on Celery's canvas (memory broker, fake clock): a chain, group or
chord of DeadlineTasks that cannot fit its deadline is refused whole, nothing published;
one that fits is published as Celery publishes it."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from celery._state import _task_stack  # type: ignore[attr-defined]
from celery.canvas import _chain

from celery_deadlines import (
    DEADLINE_HEADER,
    SOURCE_HEADER,
    ConfigurationError,
    DeadlineRefused,
    DeadlineTask,
    WorkflowRefused,
    deadline_scope,
)
from celery_deadlines.core import canvas as gate
from celery_deadlines.rules.gates import Decision
from celery_deadlines.rules.wire import encode
from celery_deadlines.testing import FakeClock
from tests.support.unit_tasks import start_attempt


def make(app: Celery, name: str, **options: Any) -> Any:
    @app.task(base=DeadlineTask, name=name, shared=False, **options)
    def work(*args: Any) -> int:
        return 1

    return work


def plain(*args: Any) -> int:
    return 1


@pytest.fixture
def tasks(app: Celery, clock: FakeClock) -> dict[str, Any]:
    return {
        "a": make(app, "wf.a", attempt_timeout=10, budget=30),
        "b": make(app, "wf.b", attempt_timeout=15),
        "c": make(app, "wf.c", time_limit=12),
        "bare": make(app, "wf.bare"),
        "plain": app.task(name="wf.plain", shared=False)(plain),
    }


HOUR = timedelta(hours=1)


def refused(run: Any) -> WorkflowRefused:
    with pytest.raises(WorkflowRefused) as caught:
        run()
    return caught.value


def test_a_chain_that_cannot_fit_is_refused_whole_and_nothing_is_published(
    tasks: dict[str, Any],
    clock: FakeClock,
    published: list[dict[str, Any]],
    refusals: list[Decision],
) -> None:
    a, b, c = tasks["a"], tasks["b"], tasks["c"]
    refusal = refused(lambda: (a.s() | b.s() | c.s()).apply_async())
    assert published == []
    assert isinstance(refusal, DeadlineRefused)
    assert refusal.reason == "workflow_cannot_fit"
    assert refusal.deadline_at == clock.now() + timedelta(seconds=30)
    assert refusal.detail == (
        "the workflow needs 37.000 s (wf.a: attempt timeout 10.000 s + wf.b: attempt timeout "
        "15.000 s + wf.c: attempt timeout 12.000 s) but 30.000 s left"
    )
    assert [decision.reason for decision in refusals] == ["workflow_cannot_fit"]


def test_a_chain_that_fits_is_published_as_celery_publishes_it(
    tasks: dict[str, Any], clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    a, b = tasks["a"], tasks["b"]
    result = chain(a.s(), b.s()).apply_async()
    assert [headers["task"] for headers in published] == ["wf.a"]  # the rest rides along
    assert published[0][DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=30))
    assert result.parent is not None  # Celery's result of a chain, as without the gate


def test_a_group_that_cannot_fit_is_refused_before_its_first_member(
    tasks: dict[str, Any], published: list[dict[str, Any]]
) -> None:
    a, b = tasks["a"], tasks["b"]
    refusal = refused(lambda: group(a.s(), b.s(), a.s()).apply_async(budget=12))
    assert published == []
    assert "wf.b: attempt timeout 15.000 s) but 12.000 s left" in refusal.detail


def test_a_group_that_fits_publishes_every_member(
    tasks: dict[str, Any], published: list[dict[str, Any]]
) -> None:
    a, b = tasks["a"], tasks["b"]
    group(a.s(), b.s()).delay()
    assert sorted(headers["task"] for headers in published) == ["wf.a", "wf.b"]


def test_a_chord_counts_its_longest_header_member_then_its_body(
    tasks: dict[str, Any], published: list[dict[str, Any]]
) -> None:
    a, b, c = tasks["a"], tasks["b"], tasks["c"]
    refusal = refused(lambda: chord([a.s(), b.s()], c.s()).apply_async(budget=26))
    assert published == []
    assert "needs 27.000 s (wf.b: attempt timeout 15.000 s + wf.c: attempt timeout 12.000 s)" in (
        refusal.detail
    )
    chord([a.s(), b.s()], c.s()).apply_async(budget=27)
    assert sorted(headers["task"] for headers in published) == ["wf.a", "wf.b"]


def test_a_chord_called_with_its_body_is_checked_with_that_body(
    tasks: dict[str, Any], published: list[dict[str, Any]]
) -> None:
    a, c = tasks["a"], tasks["c"]
    with deadline_scope(budget=20):
        refused(lambda: chord([a.s()])(c.s()))
    assert published == []


def test_nesting_is_checked_as_one_workflow(
    tasks: dict[str, Any], published: list[dict[str, Any]]
) -> None:
    a, b, c = tasks["a"], tasks["b"], tasks["c"]
    # a, then (b | c) beside a: 10 + max(27, 10) = 37 > 30
    workflow = a.s() | group(b.s() | c.s(), a.s())
    refused(workflow.apply_async)
    assert published == []
    # a group led chain becomes a chord: max(10, 15) + 12 = 27 fits 30
    (group(a.s(), b.s()) | c.s()).apply_async(budget=30)
    assert len(published) == 2


def test_countdowns_of_the_call_and_of_a_step_count(
    tasks: dict[str, Any], published: list[dict[str, Any]]
) -> None:
    a, b = tasks["a"], tasks["b"]
    refusal = refused(lambda: (a.s() | b.s()).apply_async(countdown=6))
    assert refusal.detail.startswith("the workflow needs 31.000 s (wf.a: countdown 6.000 s")
    refusal = refused(lambda: (a.s() | b.s().set(countdown=6)).apply_async())
    assert "wf.a: attempt timeout 10.000 s + wf.b: countdown 6.000 s" in refusal.detail
    assert published == []


def test_a_reserve_and_a_signature_time_limit_count(
    app: Celery, tasks: dict[str, Any], published: list[dict[str, Any]]
) -> None:
    a, b = tasks["a"], tasks["b"]
    reserved = make(app, "wf.reserved", attempt_timeout=1, reserve=25)
    refusal = refused(lambda: (a.s() | reserved.s()).apply_async())
    assert refusal.detail.startswith("the workflow needs 35.000 s (wf.a: attempt timeout 10.000 s")
    assert "wf.reserved: reserve 25.000 s" in refusal.detail
    # a signature's time_limit can only shorten the attempt: 10 + 5 fits 30
    (a.s() | b.s().set(time_limit=5) | b.s().set(time_limit=5)).apply_async()
    assert len(published) == 1


def test_plain_and_undeclared_steps_count_as_zero_and_are_named(
    tasks: dict[str, Any], published: list[dict[str, Any]]
) -> None:
    a, bare, plain = tasks["a"], tasks["bare"], tasks["plain"]
    refusal = refused(lambda: (a.s() | plain.s() | bare.s() | a.s() | a.s() | a.s()).delay())
    assert refusal.detail.endswith(
        "but 30.000 s left; no attempt timeout declared, counted as zero: wf.plain, wf.bare"
    )
    assert published == []


def test_a_canvas_of_plain_tasks_only_is_not_checked(
    tasks: dict[str, Any], clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    plain, a = tasks["plain"], tasks["a"]
    with deadline_scope(budget=1):
        clock.advance(5)  # the scope's deadline has passed: any checked canvas is refused
        refused(lambda: group(plain.s(), a.s()).apply_async())
        group(plain.s(), plain.s()).apply_async()
    assert len(published) == 2


def test_the_governing_deadline_is_the_scopes_or_the_parents(
    tasks: dict[str, Any], published: list[dict[str, Any]]
) -> None:
    b, c = tasks["b"], tasks["c"]
    with deadline_scope(budget=20):
        refusal = refused(lambda: (b.s() | c.s()).apply_async())
    assert "but 20.000 s left" in refusal.detail
    (b.s() | c.s()).apply_async()  # no deadline anywhere: nothing to fit
    assert len(published) == 1


def test_a_canvas_published_from_a_task_is_governed_by_that_tasks_deadline(
    tasks: dict[str, Any], clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    bare, b, c = tasks["bare"], tasks["b"], tasks["c"]
    headers = {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=18)), SOURCE_HEADER: "call"}
    start_attempt(bare, headers)
    _task_stack.push(bare)
    try:
        refusal = refused(lambda: group(b.s(), c.s() | c.s()).apply_async())
    finally:
        _task_stack.pop()
        bare.pop_request()
    assert "needs 24.000 s (wf.c: attempt timeout 12.000 s + wf.c: attempt timeout 12.000 s)" in (
        refusal.detail
    )
    assert "but 18.000 s left" in refusal.detail
    assert published == []


def test_an_eager_workflow_is_checked_before_anything_runs(
    app: Celery, tasks: dict[str, Any]
) -> None:
    app.conf.task_always_eager = True
    ran: list[str] = []

    @app.task(base=DeadlineTask, name="wf.record", shared=False, attempt_timeout=20)
    def record(*args: Any) -> None:
        ran.append("record")

    refused(lambda: group(record.s(), record.s() | record.s()).apply_async(budget=30))
    assert ran == []
    group(record.s(), record.s()).apply_async(budget=30)
    assert ran == ["record", "record"]


def test_a_chord_given_its_body_by_keyword_is_checked_with_that_body(
    tasks: dict[str, Any], published: list[dict[str, Any]]
) -> None:
    a, c = tasks["a"], tasks["c"]
    refused(lambda: chord([a.s(), a.s()]).apply_async(kwargs={"body": c.s() | c.s()}))
    assert published == []


def test_warn_only_logs_the_arithmetic_and_publishes(
    app: Celery,
    tasks: dict[str, Any],
    published: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    app.conf.deadlines_workflow_check = "warn"
    a, b, c = tasks["a"], tasks["b"], tasks["c"]
    with caplog.at_level(logging.WARNING, logger="celery_deadlines"):
        (a.s() | b.s() | c.s()).apply_async()
    assert len(published) == 1
    assert "workflow_cannot_fit" in caplog.text
    assert "the workflow needs 37.000 s" in caplog.text


def test_off_does_not_check(
    app: Celery, tasks: dict[str, Any], published: list[dict[str, Any]]
) -> None:
    app.conf.deadlines_workflow_check = "off"
    a, b, c = tasks["a"], tasks["b"], tasks["c"]
    (a.s() | b.s() | c.s()).apply_async()
    assert len(published) == 1


def test_a_bad_setting_raises_naming_it_and_publishes_nothing(
    app: Celery, tasks: dict[str, Any], published: list[dict[str, Any]]
) -> None:
    app.conf.deadlines_workflow_check = "loud"
    a, b = tasks["a"], tasks["b"]
    expected = r"deadlines_workflow_check.*'refuse', 'warn', 'off'"
    with pytest.raises(ConfigurationError, match=expected):
        (a.s() | b.s()).apply_async()
    assert published == []


def test_a_chains_later_hops_are_left_to_each_steps_enqueue_gate(
    tasks: dict[str, Any], published: list[dict[str, Any]]
) -> None:
    # what Celery's tracer does after a step: the next one, with the rest as chain=
    b, c = tasks["b"], tasks["c"]
    rest = _chain(b.s(), c.s())
    rest.apply_async(chain=[], budget=5)
    assert [headers["task"] for headers in published] == ["wf.b"]


def test_a_chords_body_published_by_the_header_task_that_completes_it_is_not_checked_again(
    tasks: dict[str, Any], clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    # the body was checked with its chord at the enqueue; in the worker, the last header
    # task publishes it (Celery's backend: callback.delay()) with less time left
    a, b, c = tasks["a"], tasks["b"], tasks["c"]
    body = b.s() | c.s()
    body.freeze()
    header_task = tasks["bare"]
    headers = {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=20)), SOURCE_HEADER: "call"}
    start_attempt(header_task, headers)
    header_task.request.chord = dict(body)
    _task_stack.push(header_task)
    try:
        body.clone().delay()  # what the backend rebuilds from request.chord
        assert [headers["task"] for headers in published] == ["wf.b"]
        refused(lambda: (a.s() | c.s() | c.s()).delay())  # a new workflow is checked
    finally:
        _task_stack.pop()
        header_task.pop_request()


def test_the_gate_is_in_place_once_and_can_be_removed(tasks: dict[str, Any]) -> None:
    assert gate.patched()
    wrapped = group.apply_async
    gate.patch()
    assert group.apply_async is wrapped  # idempotent
    gate.unpatch()
    try:
        assert not gate.patched()
        assert group.apply_async is wrapped.__wrapped__  # type: ignore[attr-defined]
    finally:
        gate.patch()
    assert gate.patched()


@pytest.mark.parametrize(
    ("options", "call", "scope", "parent"),
    [
        ({"budget": 30}, {}, None, None),
        ({}, {"budget": 12}, None, None),
        ({"budget": 30}, {"budget": 50}, 20, None),
        ({}, {}, None, 18),
        ({"budget": 5}, {}, None, 18),
        ({"deadline_kind": "delivery", "budget": 30}, {}, None, 18),
        ({}, {"delivery_budget": 40}, 25, None),
        ({}, {}, None, None),
    ],
)
def test_the_workflow_gates_deadline_is_the_one_apply_async_stamps(
    app: Celery,
    clock: FakeClock,
    published: list[dict[str, Any]],
    options: dict[str, Any],
    call: dict[str, Any],
    scope: float | None,
    parent: float | None,
) -> None:
    # the gate and apply_async ask the same rule (publishing.stamp): what the gate judges
    # by is what the message carries
    from contextlib import nullcontext

    from celery_deadlines import DELIVERY_DEADLINE_HEADER
    from celery_deadlines.conf import settings_for
    from celery_deadlines.core import publishing
    from celery_deadlines.core.options import times

    task = make(app, "wf.same", **options)
    parent_task = make(app, "wf.parent")
    if parent is not None:
        at = clock.now() + timedelta(seconds=parent)
        carried = {DEADLINE_HEADER: encode(at), DELIVERY_DEADLINE_HEADER: encode(at + HOUR)}
        start_attempt(parent_task, carried)
        _task_stack.push(parent_task)
    try:
        with deadline_scope(budget=scope) if scope is not None else nullcontext():
            registered = app.tasks[task.name]  # as the gate finds it (not a proxy)
            governing = gate._governing(registered, dict(call), clock.now(), settings_for(app))
            stamp = publishing.stamp(
                task,
                dict(call),
                dict(call.get("headers") or {}),
                now=clock.now(),
                parent=publishing.inherited_by(task),
                task_id=None,
                times=times(task, settings_for(app)),
            )
            task.apply_async(**call)
    finally:
        if parent is not None:
            _task_stack.pop()
            parent_task.pop_request()
    headers = published[-1]
    assert stamp is not None
    deadline = stamp.governed.deadline
    assert governing == deadline
    assert headers.get(DEADLINE_HEADER) == (encode(deadline) if deadline else None)
    assert headers.get(SOURCE_HEADER) == (stamp.governed.source if deadline else None)
    delivery = stamp.delivery
    assert headers.get(DELIVERY_DEADLINE_HEADER) == (encode(delivery) if delivery else None)
