"""The worker's main process (``DeadlineRequest``), on a fake clock: the claim gate and the
time-limit cap, before a message reaches the pool."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest.mock import Mock

import pytest
from celery import Celery
from celery.contrib.testing.mocks import TaskMessage

from celery_deadlines import DEADLINE_HEADER, SOURCE_HEADER
from celery_deadlines.core import supervision
from celery_deadlines.core.request import DeadlineRequest
from celery_deadlines.rules.gates import Decision
from celery_deadlines.rules.wire import encode
from celery_deadlines.testing import FakeClock
from tests.support.unit_tasks import claim, make_task, stored_refusal


def test_claim_refuses_an_expired_message_acks_it_and_stores_why(
    app: Celery, clock: FakeClock, refusals: list[Decision]
) -> None:
    task = make_task(app)
    request, on_ack = claim(
        app, task, {DEADLINE_HEADER: encode(clock.now() - timedelta(seconds=1))}
    )
    assert request.revoked() is True
    on_ack.assert_called_once()
    refusal = stored_refusal(app, "m-1")
    assert (refusal.gate, refusal.reason) == ("claim", "deadline_passed")
    assert [d.gate for d in refusals] == ["claim"]


def test_claim_counts_time_spent_waiting_for_a_pool_slot(app: Celery, clock: FakeClock) -> None:
    task = make_task(app, reserve=2)
    request, _ = claim(app, task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=5))})
    assert request.revoked() is False  # on arrival: 5 s left
    clock.advance(3.5)  # waiting behind busy pool processes
    assert request.revoked() is True  # when handed to the pool: 1.5 s < reserve
    assert stored_refusal(app, "m-1").reason == "insufficient_budget"


@pytest.mark.parametrize(
    "header", ["soon", float("inf"), -1, 1e300, True, {"x": 1}, [1.0], "2026-11-29T12:00"]
)
def test_claim_refuses_malformed_headers_without_raising(
    app: Celery, clock: FakeClock, header: object
) -> None:
    task = make_task(app)
    request, on_ack = claim(app, task, {DEADLINE_HEADER: header})
    assert request.revoked() is True
    on_ack.assert_called_once()
    assert stored_refusal(app, "m-1").reason == "invalid_deadline"


def test_claim_lets_a_message_without_deadline_through(app: Celery, clock: FakeClock) -> None:
    request, on_ack = claim(app, make_task(app), {})
    assert request.revoked() is False
    on_ack.assert_not_called()


def test_time_limits_are_capped_at_the_budget_left_when_handed_to_the_pool(
    app: Celery, clock: FakeClock
) -> None:
    task = make_task(app, time_limit=60, soft_time_limit=50)
    request, _ = claim(app, task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=20))})
    clock.advance(8)
    assert request.time_limits == pytest.approx((12.0, 10.0))


def test_time_limits_from_the_message_are_kept_when_shorter(app: Celery, clock: FakeClock) -> None:
    task = make_task(app)
    headers = {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=20)), "timelimit": (8, 6)}
    request, _ = claim(app, task, headers)
    assert request.time_limits == (8, 6)


def test_time_limits_are_untouched_without_a_deadline(app: Celery, clock: FakeClock) -> None:
    request, _ = claim(app, make_task(app), {"timelimit": (8, 6)})
    assert request.time_limits == (8, 6)


def test_a_late_message_is_left_to_the_pools_claim_while_the_clock_is_in_doubt_never_revoked(
    app: Celery, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression, nemesis soak seed 101: the sweeper had expired the run and stored
    # DeadlineRefused for the caller; a worker whose clock watch was in doubt let Celery's
    # own ``expires`` check (on the local wall clock) store REVOKED over it.
    from celery_deadlines import ledger

    in_doubt = Mock(budget=timedelta(seconds=1))
    in_doubt.authority_now.return_value = None
    monkeypatch.setattr(ledger, "clock_watch", lambda app: in_doubt)
    task = make_task(app)
    monkeypatch.setattr(task.backend, "mark_as_revoked", revoked := Mock())
    deadline = datetime.now(UTC) - timedelta(seconds=1)  # past by every clock
    request, on_ack = claim(app, task, {DEADLINE_HEADER: encode(deadline), "expires": deadline})
    assert request.revoked() is False  # the pool process's claim judges it
    on_ack.assert_not_called()
    revoked.assert_not_called()  # nothing stored over the run's outcome


def test_an_earlier_expires_of_the_callers_own_is_still_celerys_to_enforce(
    app: Celery, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = make_task(app)
    monkeypatch.setattr(task.backend, "mark_as_revoked", revoked := Mock())
    expires = datetime.now(UTC) - timedelta(seconds=1)
    headers = {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=60)), "expires": expires}
    request, _ = claim(app, task, headers)
    assert request.revoked() is True
    assert revoked.call_args.args[:2] == ("m-1", "expired")


def test_the_deadlines_cap_is_judged_by_the_ledgers_clock_not_a_wall_clock_stepped_back(
    app: Celery, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression, nemesis soak seed 6161: the pool process killed at the deadline's cap
    # on a worker whose wall clock had been stepped back 10.8 s ended FAILED time_limit.
    from celery_deadlines import ledger

    deadline = clock.now() + timedelta(seconds=3)
    watch = Mock(budget=timedelta(seconds=1))
    watch.authority_now.return_value = deadline  # the ledger's clock: at the deadline
    monkeypatch.setattr(ledger, "clock_watch", lambda app: watch)
    written: list[tuple[str, str]] = []
    api = Mock()
    api.end_owned.side_effect = lambda app, **kw: written.append((kw["status"], kw["reason"]))
    monkeypatch.setattr(ledger, "api_for", lambda app: api)
    monkeypatch.setattr(supervision, "_with_ledger", lambda request: True)
    request, _ = claim(app, make_task(app), {DEADLINE_HEADER: encode(deadline)})
    clock.jump_wall(-10.8)  # the worker's wall clock, stepped back
    supervision.time_limit_outcome(request, 2.9)
    assert written == [("EXPIRED", "deadline_passed")]


def test_a_kill_by_the_deadlines_cap_expires_the_run_whatever_the_clock_reads_then(
    app: Celery, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression, nemesis soak seeds 8181 and 438993: runs killed by the hard limit the
    # deadline put there ended FAILED time_limit, the clock that judged them reading an
    # instant before the deadline (its estimate of the ledger's clock not yet corrected
    # after a step). The limit handed to the pool says whose it was.
    from celery_deadlines import ledger

    deadline = clock.now() + timedelta(seconds=3)
    written: list[tuple[str, str]] = []
    api = Mock()
    api.end_owned.side_effect = lambda app, **kw: written.append((kw["status"], kw["reason"]))
    monkeypatch.setattr(ledger, "api_for", lambda app: api)
    monkeypatch.setattr(supervision, "_with_ledger", lambda request: True)
    capped, _ = claim(app, make_task(app), {DEADLINE_HEADER: encode(deadline)})
    assert capped.time_limits[0] == pytest.approx(3)  # handed to the pool: the cap
    clock.jump_wall(-5)  # the kill, judged by a clock that reads 5 s early
    supervision.time_limit_outcome(capped, 3.0)
    limited = make_task(app, name="unit.limited", time_limit=1)
    own, _ = claim(app, limited, {DEADLINE_HEADER: encode(deadline)})
    assert own.time_limits[0] == 1  # the task's own limit, shorter than the deadline's
    supervision.time_limit_outcome(own, 1.0)
    assert written == [("EXPIRED", "deadline_passed"), ("FAILED", "time_limit")]


def test_an_iso_expires_is_parsed_by_the_standard_library_and_celerys_request_is_untouched(
    app: Celery, clock: FakeClock
) -> None:
    import inspect

    import celery.utils.time
    from celery.worker.request import Request

    from celery_deadlines.core.request import DeadlineRequest, fast_iso8601

    def parser(cls: type) -> object:
        return inspect.signature(vars(cls)["__init__"]).parameters["maybe_iso8601"].default

    assert parser(DeadlineRequest) is fast_iso8601
    assert parser(Request) is celery.utils.time.maybe_iso8601  # Celery's own kept
    expires = (clock.now() + timedelta(seconds=30)).isoformat()
    request, _ = claim(app, make_task(app), {"expires": expires})
    assert request.expires == datetime.fromisoformat(expires)


def test_a_default_that_a_function_does_not_have_is_passed_by_a_wrapper() -> None:
    from celery_deadlines.core.request import _with_default

    calls: list[dict[str, object]] = []

    def init(self: object, message: object, **options: object) -> None:
        calls.append(options)

    _with_default(init, "maybe_iso8601", "fast")(object(), "message")
    assert calls == [{"maybe_iso8601": "fast"}]


def test_the_cap_handed_to_the_pool_is_measured_when_celery_reads_it(
    app: Celery, clock: FakeClock
) -> None:
    # each hook reads the clock itself: the claim gate's reading is not handed to the
    # cap Celery reads next (that depended on Celery calling them in that order)
    request, _ = claim(
        app, make_task(app), {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=20))}
    )
    clock.advance(5)
    assert request.revoked() is False  # the hand-off: 15 s left
    clock.advance(0.5)
    assert request.time_limits[0] == pytest.approx(14.5)
    clock.advance(0.5)
    assert request.time_limits[0] == pytest.approx(14.0)


# -- a deadline that was Celery's own ``expires``: told as Celery tells its expiry ------


@pytest.fixture
def revoked_signals() -> Iterator[list[dict[str, Any]]]:
    """Celery's ``task_revoked`` signals sent meanwhile (their keyword arguments)."""
    from celery.signals import task_revoked

    sent: list[dict[str, Any]] = []

    def receive(**fields: Any) -> None:
        sent.append(fields)

    task_revoked.connect(receive, weak=False)
    yield sent
    task_revoked.disconnect(receive)


@pytest.mark.parametrize(("left", "reason"), [(-1, "deadline_passed"), (1, "insufficient_budget")])
def test_claim_tells_a_message_whose_deadline_was_its_expires_what_celery_tells_of_an_expiry(
    app: Celery,
    clock: FakeClock,
    revoked_signals: list[dict[str, Any]],
    refusals: list[Decision],
    left: float,
    reason: str,
) -> None:
    from celery.exceptions import TaskRevokedError
    from celery.worker.state import revoked

    task = make_task(app, reserve=2)
    expires = clock.now() + timedelta(seconds=left)
    headers: dict[str, Any] = {
        DEADLINE_HEADER: encode(expires),
        SOURCE_HEADER: "expires",
        "expires": expires,
    }
    message = TaskMessage(task.name, id="expired-1", **headers)
    eventer, on_ack = Mock(enabled=True), Mock()
    request = DeadlineRequest(message, app=app, task=task, on_ack=on_ack, eventer=eventer)
    try:
        assert request.revoked() is True
        on_ack.assert_called_once()
        result = app.AsyncResult("expired-1")
        assert str(result.state) == "REVOKED"
        assert isinstance(result.result, TaskRevokedError)
        assert str(result.result) == "expired"
        [(kind, fields)] = [(c.args[0], c.kwargs) for c in eventer.send.call_args_list]
        assert kind == "task-revoked"
        assert (fields["terminated"], fields["signum"], fields["expired"]) == (False, None, True)
        assert [(s["expired"], s["request"].id) for s in revoked_signals] == [(True, "expired-1")]
        assert "expired-1" in revoked  # as Celery's own expires check keeps it
        assert [(d.gate, d.reason) for d in refusals] == [("claim", reason)]  # still reported
    finally:
        revoked.discard("expired-1")


@pytest.mark.parametrize("source", ["default", "call", "scope", "parent", "task", "setting", "x"])
def test_claim_tells_a_message_whose_deadline_came_from_anywhere_else_the_typed_refusal(
    app: Celery, clock: FakeClock, source: str
) -> None:
    task = make_task(app)
    deadline = clock.now() - timedelta(seconds=1)
    request, _ = claim(app, task, {DEADLINE_HEADER: encode(deadline), SOURCE_HEADER: source})
    assert request.revoked() is True
    assert stored_refusal(app, "m-1").reason == "deadline_passed"


def test_a_delivery_tasks_message_past_its_expires_is_told_delivery_expired(
    app: Celery, clock: FakeClock
) -> None:
    # a delivery task's deadline is its delivery deadline: not Celery's expiry
    task = make_task(app, deadline_kind="delivery")
    deadline = clock.now() - timedelta(seconds=1)
    request, _ = claim(app, task, {DEADLINE_HEADER: encode(deadline), SOURCE_HEADER: "expires"})
    assert request.revoked() is True
    assert stored_refusal(app, "m-1").reason == "delivery_expired"
