"""The gates' shortcuts in epoch seconds (the path of every message of a worker without a
ledger: ``core/publishing.stamp_own_budget``, ``core/request.clearly_in_time`` and the
time-limit cap after it, ``core/starting.start_in_seconds``) decide exactly what the
full rule, with datetimes, decides: the publish's headers, the claim gate's admission
and time-limit cap, and the attempt gate's deadline and anchor. Each property draws
deadlines around the edges the fast paths hand back to the full rule (the reserve, the
horizon, the microsecond a float cannot tell apart), so a fast path that admits what the
full rule refuses, or the other way round, fails here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Ignore, Reject
from celery.utils import uuid
from hypothesis import example, given, settings
from hypothesis import strategies as st

from celery_deadlines import DEADLINE_HEADER, DeadlineRefused
from celery_deadlines import clock as installed
from celery_deadlines.contrib import opentelemetry as tracing
from celery_deadlines.core import publishing, starting
from celery_deadlines.core import request as requests
from celery_deadlines.rules import wire
from celery_deadlines.testing import FakeClock, use_clock
from tests.support.unit_tasks import claim, make_task

EXAMPLES = int(os.environ.get("DEADLINES_FUZZ_EXAMPLES", "250"))
HORIZON = 3600.0  # deadlines_max_budget in these tests
RESERVES = st.sampled_from([0, 0.5, 2, 30])
#: how far ahead of the clock the deadline is: around zero, the reserves, the horizon,
#: with the microseconds a float keeps or loses
AHEAD = st.one_of(
    st.sampled_from([0.5, 2, 30, HORIZON]).flatmap(
        lambda edge: st.floats(edge - 0.002, edge + 0.002, allow_nan=False)
    ),
    st.floats(-5, HORIZON + 5, allow_nan=False),
)
#: the fake clock's instant: any microsecond, far from 1970 (where floats are coarse)
START = st.datetimes(
    min_value=datetime(2026, 1, 1), max_value=datetime(2040, 1, 1), timezones=st.just(UTC)
)


@pytest.fixture
def horizon_app(app: Celery) -> Celery:
    app.conf.deadlines_max_budget = HORIZON
    return app


@contextmanager
def an_app(start: datetime) -> Iterator[Celery]:
    """A fresh app (as the ``app`` fixture's) on a fake clock at ``start``: one per example."""
    app = Celery("unit", broker="memory://", backend="cache+memory://", set_as_current=True)
    app.conf.deadlines_ledger = False
    app.conf.deadlines_max_budget = HORIZON
    with use_clock(FakeClock(start)):
        yield app
    app.close()


@contextmanager
def full_rule_only() -> Iterator[None]:
    """The claim gate's path in seconds switched off, and so the time-limit cap's after
    it: every message to the full rule."""
    clearly_in_time = requests.clearly_in_time
    requests.clearly_in_time = lambda task, deadline: False
    try:
        yield
    finally:
        requests.clearly_in_time = clearly_in_time


def _claimed(app: Celery, task: Any, deadline: float) -> tuple[bool, Any]:
    # an id of its own: Celery's worker remembers the ids it revoked
    request, _ = claim(app, task, {DEADLINE_HEADER: deadline}, task_id=uuid())
    revoked = request.revoked()
    return revoked, (None if revoked else request.time_limits)


@settings(max_examples=EXAMPLES, deadline=None)
@given(start=START, ahead=AHEAD, reserve=RESERVES, time_limit=st.sampled_from([None, 10, 7200]))
def test_the_claim_gate_in_seconds_admits_and_caps_exactly_as_the_full_rule(
    start: datetime, ahead: float, reserve: float, time_limit: int | None
) -> None:
    print(f"start={start.isoformat()} ahead={ahead!r} reserve={reserve} limit={time_limit}")
    with an_app(start) as app:
        task = make_task(app, reserve=reserve, time_limit=time_limit)
        deadline = installed.epoch() + ahead
        fast = _claimed(app, task, deadline)
        with full_rule_only():
            full = _claimed(app, task, deadline)
    assert fast[0] == full[0]
    if fast[1] is not None:
        assert fast[1] == pytest.approx(full[1], abs=1e-5)


def _attempt(task: Any, headers: dict[str, Any], in_full: bool) -> tuple[Any, ...]:
    task.push_request(id="t-1", headers=headers, retries=0, called_directly=False)
    request = task.request
    try:
        state = (
            starting.start_in_full(task, request, headers, False)
            if in_full
            else starting.start(task, request, False)
        )
    except (Ignore, Reject) as refused:  # the refusal stored, Celery told at the edge
        return ("refused", str(refused))
    finally:
        task.pop_request()
    if state is None:
        return ("nothing kept",)
    anchor = state.anchor
    return (
        "started",
        state.carried.deadline,
        state.carried.origin,
        None if anchor is None else anchor.deadline,
        None if anchor is None else anchor.budget_at_start.total_seconds(),
        None if anchor is None else anchor.started_monotonic,
    )


@settings(max_examples=EXAMPLES, deadline=None)
@given(start=START, ahead=AHEAD, reserve=RESERVES)
def test_the_attempt_gate_in_seconds_keeps_what_the_full_rule_keeps(
    start: datetime, ahead: float, reserve: float
) -> None:
    print(f"start={start.isoformat()} ahead={ahead!r} reserve={reserve}")
    with an_app(start) as app:
        task = make_task(app, reserve=reserve)
        headers = {DEADLINE_HEADER: installed.epoch() + ahead, "origin": "o-1"}
        fast = _attempt(task, dict(headers), in_full=False)
        full = _attempt(task, dict(headers), in_full=True)
    assert fast[:3] == full[:3]
    if fast[0] == "started":
        assert fast[3] == full[3]
        assert fast[4] == pytest.approx(full[4], abs=1e-6)
        assert fast[5] == full[5]


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    start=START,
    budget=st.one_of(st.none(), st.floats(0.001, HORIZON), st.sampled_from([0.5, 0.501, 2.0])),
    reserve=RESERVES,
    given_headers=st.sampled_from([None, {}, {"x-trace": "1"}]),
    task_id=st.sampled_from([None, "c-1"]),
)
@example(
    start=datetime(2030, 1, 1, tzinfo=UTC),
    budget=30.0,
    reserve=0,
    given_headers=None,
    task_id="c-1",
)
def test_a_publish_stamped_in_seconds_carries_the_headers_the_full_rule_writes(
    start: datetime,
    budget: float | None,
    reserve: float,
    given_headers: dict[str, str] | None,
    task_id: str | None,
) -> None:
    print(f"start={start.isoformat()} budget={budget!r} reserve={reserve} headers={given_headers}")
    with an_app(start) as app:
        task = make_task(app, budget=budget, reserve=reserve)

        def call() -> dict[str, Any]:
            return {} if given_headers is None else {"headers": dict(given_headers)}

        fast_call = call()
        fast = publishing.stamp_own_budget(task, fast_call, task_id)
        full_call = call()
        try:
            stamp, _ = publishing.stamp_message(task, full_call, task_id, False)
        except DeadlineRefused:
            assert fast is None  # the full rule refuses: the fast path never decided
            return
    if fast is None:
        return  # handed to the full rule
    assert fast is (stamp is not None)
    fast_headers = dict(fast_call.get("headers") or {})
    full_headers = dict(full_call.get("headers") or {})
    fast_deadline = fast_headers.pop(DEADLINE_HEADER, None)
    full_deadline = full_headers.pop(DEADLINE_HEADER, None)
    assert fast_headers == full_headers
    if full_deadline is None:
        assert fast_deadline is None
    else:
        assert fast_deadline == pytest.approx(full_deadline, abs=1e-6)


def test_a_clearly_in_time_header_is_admitted_in_seconds_without_a_datetime(
    horizon_app: Celery, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_datetime(*_: object, **__: object) -> datetime:
        raise AssertionError("the full rule read the header")

    monkeypatch.delitem(sys.modules, tracing.API, raising=False)  # no tracing to tell
    monkeypatch.setattr(wire, "decode", no_datetime)
    task = make_task(horizon_app, reserve=1, time_limit=60)
    revoked, limits = _claimed(horizon_app, task, clock.now().timestamp() + 20)
    assert (revoked, limits) == (False, pytest.approx((20.0, None)))
    state = starting.start(
        task, _pushed(task, {DEADLINE_HEADER: clock.now().timestamp() + 20}), False
    )
    assert state is not None
    assert state.headers is not None  # admitted in seconds: kept as it came
    assert state.attempt is None
    task.pop_request()


def test_a_publish_of_a_task_without_budget_outside_any_task_is_celerys_own(
    horizon_app: Celery, clock: FakeClock
) -> None:
    call: dict[str, Any] = {"headers": {"x-trace": "1"}}
    assert publishing.stamp_own_budget(make_task(horizon_app), call, "c-1") is False
    assert call == {"headers": {"x-trace": "1"}}


@pytest.mark.parametrize(
    "call",
    [
        {"countdown": 5},
        {"eta": datetime(2030, 1, 1, tzinfo=UTC)},
        {"expires": 60},
        {"budget": 5},
        {"headers": {DEADLINE_HEADER: 1.0}},
        {"headers": {wire.DELIVERY_DEADLINE_HEADER: 1.0}},
    ],
    ids=["countdown", "eta", "expires", "budget option", "deadline header", "delivery header"],
)
def test_a_publish_that_names_a_time_of_its_own_is_stamped_by_the_full_rule(
    horizon_app: Celery, clock: FakeClock, call: dict[str, Any]
) -> None:
    task = make_task(horizon_app, budget=30)
    before = dict(call)
    assert publishing.stamp_own_budget(task, call, "c-1") is None
    assert call == before  # nothing written: the full rule starts from what was given


def test_the_fake_clock_set_by_a_test_is_the_one_the_seconds_paths_read() -> None:
    fake = FakeClock(datetime(2031, 5, 1, tzinfo=UTC))
    with use_clock(fake):
        assert installed.epoch() == fake.now().timestamp()
        fake.advance(2.5)
        assert installed.epoch() == fake.now().timestamp()
        assert installed.monotonic() == fake.monotonic()
    assert abs(installed.epoch() - datetime.now(UTC).timestamp()) < 60


def _pushed(task: Any, headers: dict[str, Any]) -> Any:
    task.push_request(id="t-2", headers=headers, retries=0, called_directly=False)
    return task.request
