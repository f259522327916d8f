"""The current deadline, on the calls a body makes to other services (the glue of
celery_deadlines.core.outbound, fake clock): the headers that say it, read inside a task, a
scope, or nowhere, and the outbound gate, reported once."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from celery._state import _task_stack  # type: ignore[attr-defined]

from celery_deadlines import (
    DEADLINE_HEADER,
    ConfigurationError,
    DeadlineRefused,
    InvalidDeadline,
    deadline_headers,
    deadline_scope,
)
from celery_deadlines.core.outbound import prepare
from celery_deadlines.rules.gates import Decision, Gate, Reason
from celery_deadlines.rules.wire import encode
from celery_deadlines.testing import FakeClock
from tests.support.unit_tasks import make_task, start_attempt


@contextmanager
def running(task: Any, headers: dict[str, Any], task_id: str = "t-1") -> Iterator[None]:
    """``task``'s attempt on ``headers`` runs in this thread, as in a worker's pool."""
    start_attempt(task, headers, task_id)
    _task_stack.push(task)
    try:
        yield
    finally:
        _task_stack.pop()
        task.pop_request()


def relative(headers: dict[str, str]) -> tuple[str, str]:
    return headers["grpc-timeout"], headers["x-request-timeout-ms"]


def test_without_a_deadline_no_header_is_given_and_the_call_goes_as_written(app: Celery) -> None:
    assert deadline_headers() == {}
    assert prepare("GET api") is None


def test_inside_a_scope_the_headers_say_the_scopes_deadline(app: Celery, clock: FakeClock) -> None:
    with deadline_scope(budget=8, app=app):
        clock.advance(3)
        sent = deadline_headers()
    assert relative(sent) == ("5000000u", "5000")
    assert sent["x-request-deadline"] == "2030-01-01T12:00:08.000000Z"  # the fake clock's


def test_inside_an_attempt_the_time_left_runs_on_its_monotonic_clock(
    app: Celery, clock: FakeClock
) -> None:
    task = make_task(app)
    deadline = clock.now() + timedelta(seconds=10)
    with running(task, {DEADLINE_HEADER: encode(deadline)}):
        clock.advance(2)
        clock.jump_wall(-3600)  # a wall clock stepped back adds no time to the call
        sent = deadline_headers()
        call = prepare("GET api")
    assert relative(sent) == ("8000000u", "8000")
    assert sent["x-request-deadline"] == "2030-01-01T12:00:10.000000Z"
    assert call is not None
    assert call.timeout == timedelta(seconds=8) - timedelta(milliseconds=100)


def test_a_scope_inside_a_task_can_only_shorten_what_a_call_carries(
    app: Celery, clock: FakeClock
) -> None:
    task = make_task(app)
    with running(task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=10))}):
        with deadline_scope(budget=4, app=app):
            shorter = deadline_headers()
        with deadline_scope(budget=60, app=app):
            longer = deadline_headers()
    assert relative(shorter) == ("4000000u", "4000")
    assert relative(longer) == ("10000000u", "10000")


def test_an_admitted_calls_time_shrinks_as_time_passes(app: Celery, clock: FakeClock) -> None:
    with deadline_scope(budget=5, app=app):
        call = prepare("GET api")
    assert call is not None
    assert call.cap(None) == pytest.approx(4.9)
    assert call.cap(2.0) == 2.0
    clock.advance(4)
    assert call.cap(2.0) == pytest.approx(0.9)
    clock.advance(1)
    assert call.cap(None) == 1e-6  # its time is up: its client's timeout error, at once


def test_each_further_attempt_of_a_call_carries_the_deadline_as_of_its_own_instant(
    app: Celery, clock: FakeClock
) -> None:
    task = make_task(app, name="unit.caller")
    with running(task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=5))}):
        call = prepare("GET api")
        assert call is not None
        clock.advance(2)
        clock.jump_wall(3600)  # an attempt's time runs on the monotonic clock, as the call's
        retry = call.again()
    assert relative(dict(retry.headers)) == ("3000000u", "3000")
    assert retry.headers["x-request-deadline"] == call.headers["x-request-deadline"]
    assert retry.timeout == timedelta(seconds=3) - timedelta(milliseconds=100)
    assert retry.cap(None) == call.cap(None) == pytest.approx(2.9)


def test_a_further_attempt_is_refused_as_the_first_and_before_a_pause_that_would_spend_it(
    app: Celery, clock: FakeClock, refusals: list[Decision], caplog: pytest.LogCaptureFixture
) -> None:
    task = make_task(app, name="unit.caller")
    with (
        caplog.at_level(logging.INFO, logger="celery_deadlines"),
        running(task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=5))}, "t-9"),
    ):
        call = prepare("GET api")
        assert call is not None
        clock.advance(3)
        call.again(pause=1.8)  # 2 s left, 0.2 s after the pause: it may start after it
        with pytest.raises(DeadlineRefused) as before_its_pause:
            call.again(pause=1.95)
        clock.advance(1.95)
        with pytest.raises(DeadlineRefused) as at_its_start:
            call.again()
    assert before_its_pause.value.detail.startswith(
        "GET api: 2.000 s left, less the client's retry pause of 1.950 s, not more than the "
        "outbound reserve of 0.100 s"
    )
    assert at_its_start.value.detail.startswith("GET api: 0.050 s left, not more than")
    assert [(d.gate, d.reason) for d in refusals] == [
        (Gate.OUTBOUND, Reason.INSUFFICIENT_BUDGET)
    ] * 2
    assert [record.getMessage()[:40] for record in caplog.records] == [
        "unit.caller[t-9] refused at outbound gat"
    ] * 2  # each refusal reported once, as the gate reports the first attempt's


def test_a_call_with_too_little_time_left_is_refused_logged_once_and_signalled(
    app: Celery,
    clock: FakeClock,
    refusals: list[Decision],
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = make_task(app, name="unit.caller")
    with (
        caplog.at_level(logging.INFO, logger="celery_deadlines"),
        running(task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=1))}, "t-9"),
    ):
        clock.advance(0.95)
        with pytest.raises(DeadlineRefused) as refused:
            prepare("POST api.example.com")
    assert (refused.value.gate, refused.value.reason) == ("outbound", "insufficient_budget")
    assert refused.value.detail.startswith(
        "POST api.example.com: 0.050 s left, not more than the outbound reserve of 0.100 s"
    )
    (decision,) = refusals
    assert (decision.gate, decision.reason) == (Gate.OUTBOUND, Reason.INSUFFICIENT_BUDGET)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith(
        "unit.caller[t-9] refused at outbound gate: insufficient_budget; deadline "
    )


def test_a_call_refused_outside_a_task_is_named_by_its_target(
    app: Celery,
    clock: FakeClock,
    refusals: list[Decision],
    caplog: pytest.LogCaptureFixture,
) -> None:
    received: list[dict[str, Any]] = []
    from celery_deadlines import deadline_refused

    def receive(sender: Any, **kwargs: Any) -> None:
        received.append({"sender": sender, **kwargs})

    deadline_refused.connect(receive, weak=False)
    try:
        with (
            caplog.at_level(logging.INFO, logger="celery_deadlines"),
            deadline_scope(budget=1, app=app),
        ):
            clock.advance(1)
            with pytest.raises(DeadlineRefused) as refused:
                prepare("GET api.example.com")
    finally:
        deadline_refused.disconnect(receive)
    assert refused.value.reason == "deadline_passed"
    (signal,) = received
    assert (signal["sender"], signal["task_id"], signal["task_name"]) == (
        "GET api.example.com",
        None,
        "GET api.example.com",
    )
    (record,) = caplog.records
    assert "GET api.example.com[no task] refused at outbound gate: deadline_passed" in (
        record.getMessage()
    )


def test_the_headers_and_the_reserve_come_from_the_settings(app: Celery, clock: FakeClock) -> None:
    app.conf.deadlines_outbound_headers = {"X-Edge-Deadline": "rfc3339", "X-Left": "milliseconds"}
    app.conf.deadlines_outbound_reserve = timedelta(seconds=2)
    with deadline_scope(budget=5, app=app):
        call = prepare("GET api")
        assert deadline_headers() == {
            "x-edge-deadline": "2030-01-01T12:00:05.000000Z",
            "x-left": "5000",
        }
        with pytest.raises(DeadlineRefused):
            prepare("GET api", reserve=5)  # the call's own reserve wins
    assert call is not None
    assert call.timeout == timedelta(seconds=3)


def test_with_no_header_names_a_call_is_still_capped(app: Celery, clock: FakeClock) -> None:
    app.conf.deadlines_outbound_headers = {}
    with deadline_scope(budget=5, app=app):
        call = prepare("GET api")
    assert call is not None
    assert call.headers == {}
    assert call.cap(None) == pytest.approx(4.9)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("deadlines_outbound_reserve", -1, "deadlines_outbound_reserve"),
        ("deadlines_outbound_reserve", "soon", "deadlines_outbound_reserve"),
        ("deadlines_outbound_headers", {"grpc-timeout": "grpc"}, "must be one of"),
        ("deadlines_outbound_headers", {"bad header": "rfc3339"}, "HTTP header name"),
        ("deadlines_outbound_headers", ["grpc-timeout"], "must map header names"),
    ],
)
def test_a_bad_outbound_setting_is_a_configuration_error_naming_it(
    app: Celery, clock: FakeClock, name: str, value: Any, message: str
) -> None:
    app.conf[name] = value
    with deadline_scope(budget=5, app=app), pytest.raises(ConfigurationError) as error:
        prepare("GET api")
    assert name in str(error.value)
    assert f"CELERY_{name.upper()}" in str(error.value)
    assert message in str(error.value)


def test_a_negative_reserve_for_a_call_is_refused_it_would_extend_the_deadline(
    app: Celery, clock: FakeClock
) -> None:
    with deadline_scope(budget=5, app=app), pytest.raises(InvalidDeadline, match="reserve"):
        prepare("GET api", reserve=-10)


def test_a_running_tasks_unreadable_deadline_refuses_every_call(
    app: Celery, clock: FakeClock, refusals: list[Decision]
) -> None:
    @app.task(bind=True, name="unit.plain", shared=False)
    def plain(self: Any) -> None:
        """A plain task: no attempt gate refused its unreadable header."""

    plain.push_request(id="p-1", headers={DEADLINE_HEADER: "next tuesday"}, called_directly=False)
    _task_stack.push(plain)
    try:
        with pytest.raises(DeadlineRefused) as refused:
            prepare("GET api")
        with pytest.raises(InvalidDeadline, match="next tuesday"):
            deadline_headers()
    finally:
        _task_stack.pop()
        plain.pop_request()
    assert (refused.value.gate, refused.value.reason) == ("outbound", "invalid_deadline")
    assert [decision.reason for decision in refusals] == [Reason.INVALID_DEADLINE]


def test_importing_the_package_imports_no_client_library() -> None:
    """httpx, requests and grpcio are optional extras: only their own adapter imports
    each, and only the application imports an adapter."""
    code = (
        "import sys\n"
        "import celery_deadlines, celery_deadlines.core.outbound, celery_deadlines.task\n"
        "import celery_deadlines.middleware, celery_deadlines.core.ingress\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'httpx', 'requests', 'grpc'}))\n"
        "import celery_deadlines.contrib.httpx\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'httpx', 'requests', 'grpc'}))\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert shown == ["[]", "['httpx']"]
