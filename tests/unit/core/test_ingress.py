"""ingress_scope: a request's deadline reaches every task published while it is handled
(fake clock, memory broker), in plain Python, for any framework."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import Any

import pytest
from celery import Celery

from celery_deadlines import DEADLINE_HEADER, SOURCE_HEADER, deadline_scope, ingress_scope
from celery_deadlines.errors import InvalidDeadline
from celery_deadlines.rules.wire import encode
from celery_deadlines.testing import FakeClock
from tests.support.unit_tasks import make_task

PROXY = "10.0.0.5"


@pytest.fixture
def proxied(app: Celery) -> Celery:
    """The app, trusting deadline headers from PROXY in all three syntaxes."""
    app.conf.deadlines_trusted_proxies = ["10.0.0.0/24"]
    app.conf.deadlines_request_headers = {
        "grpc-timeout": "grpc-timeout",
        "X-Request-Timeout-Ms": "milliseconds",
        "X-Request-Deadline": "rfc3339",
    }
    return app


def test_a_task_published_while_a_request_is_handled_inherits_its_deadline(
    proxied: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    task = make_task(proxied)
    with ingress_scope({}, budget=8, peer=PROXY, app=proxied) as decision:
        clock.advance(2)
        task.delay()
    assert decision.deadline == clock.now() - timedelta(seconds=2) + timedelta(seconds=8)
    assert decision.source == "budget"
    assert published[-1][DEADLINE_HEADER] == encode(decision.deadline)
    assert published[-1][SOURCE_HEADER] == "scope"


def test_a_trusted_header_shortens_the_requests_budget(
    proxied: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    with ingress_scope({"Grpc-Timeout": "1500m"}, budget=8, peer=PROXY, app=proxied) as decision:
        make_task(proxied).delay()
    assert decision.deadline == clock.now() + timedelta(milliseconds=1500)
    assert decision.source == "header grpc-timeout"
    assert published[-1][DEADLINE_HEADER] == encode(decision.deadline)


def test_a_header_from_an_untrusted_peer_is_ignored_and_logged(
    proxied: Celery,
    clock: FakeClock,
    published: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        caplog.at_level(logging.INFO, logger="celery_deadlines"),
        ingress_scope({"grpc-timeout": "1S"}, budget=8, peer="203.0.113.9", app=proxied),
    ):
        make_task(proxied).delay()
    assert published[-1][DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=8))
    (record,) = caplog.records
    assert record.levelno == logging.INFO
    assert "grpc-timeout='1S' from 203.0.113.9 ignored (untrusted)" in record.getMessage()


def test_a_malformed_header_from_a_trusted_proxy_is_a_warning(
    proxied: Celery, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.INFO, logger="celery_deadlines"),
        ingress_scope({"x-request-deadline": "tomorrow"}, budget=8, peer=PROXY, app=proxied) as d,
    ):
        pass
    assert d.deadline == clock.now() + timedelta(seconds=8)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "ignored (malformed)" in record.getMessage()


def test_trusted_says_whether_the_peer_is_trusted_when_the_caller_knows(
    proxied: Celery, clock: FakeClock
) -> None:
    with ingress_scope({"grpc-timeout": "1S"}, budget=8, trusted=True, app=proxied) as d:
        assert d.deadline == clock.now() + timedelta(seconds=1)
    with ingress_scope(
        {"grpc-timeout": "1S"}, budget=8, peer=PROXY, trusted=False, app=proxied
    ) as d:
        assert d.deadline == clock.now() + timedelta(seconds=8)


def test_without_a_budget_no_scope_is_opened_and_no_header_makes_one(
    proxied: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    with ingress_scope({"grpc-timeout": "1S"}, peer=PROXY, app=proxied) as decision:
        make_task(proxied).delay()
    assert decision.deadline is None
    assert DEADLINE_HEADER not in published[-1]


def test_the_default_request_budget_applies_when_the_caller_names_none(
    proxied: Celery, clock: FakeClock
) -> None:
    proxied.conf.deadlines_request_budget = 30
    with ingress_scope({}, app=proxied) as decision:
        assert decision.deadline == clock.now() + timedelta(seconds=30)
        assert decision.source == "default request budget"
    with ingress_scope({}, budget=None, app=proxied) as decision:
        assert decision.deadline is None


def test_a_bad_budget_is_the_callers_error(proxied: Celery, clock: FakeClock) -> None:
    for bad in (0, -1, "10", timedelta(days=8)):
        with pytest.raises(InvalidDeadline), ingress_scope({}, budget=bad, app=proxied):  # type: ignore[arg-type]
            pass


def test_an_enclosing_scope_can_only_shorten_a_requests_deadline(
    proxied: Celery, clock: FakeClock
) -> None:
    with (
        deadline_scope(budget=2, app=proxied),
        ingress_scope({}, budget=8, app=proxied) as decision,
    ):
        assert decision.deadline == clock.now() + timedelta(seconds=2)
        assert decision.source == "enclosing scope"


def test_the_request_is_reported_to_the_observability_integration(
    proxied: Celery, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(
        "celery_deadlines.core.telemetry.annotate_ingress", lambda **given: seen.append(given)
    )
    with ingress_scope({"grpc-timeout": "3S"}, budget=8, peer=PROXY, app=proxied):
        pass
    with ingress_scope({}, budget=None, app=proxied):
        pass
    assert seen == [
        {
            "deadline": clock.now() + timedelta(seconds=3),
            "source": "header grpc-timeout",
            "remaining": timedelta(seconds=3),
        }
    ]


def test_concurrent_async_requests_each_publish_under_their_own_deadline(
    proxied: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    task = make_task(proxied)

    async def handle(budget: int, started: asyncio.Event, other: asyncio.Event) -> datetime:
        with ingress_scope({}, budget=budget, app=proxied) as decision:
            started.set()
            await other.wait()  # the other request is inside its own scope now
            task.apply_async(headers={"budget": budget})
            assert decision.deadline is not None
            return decision.deadline

    async def both() -> list[datetime]:
        first, second = asyncio.Event(), asyncio.Event()
        return list(await asyncio.gather(handle(5, first, second), handle(9, second, first)))

    deadlines = asyncio.run(both())
    by_budget = {message["budget"]: message[DEADLINE_HEADER] for message in published}
    assert by_budget == {5: encode(deadlines[0]), 9: encode(deadlines[1])}
    assert deadlines[0] == clock.now() + timedelta(seconds=5)
