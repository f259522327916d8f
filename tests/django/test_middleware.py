"""DeadlineMiddleware: a task a view publishes inherits the request's deadline, in WSGI
and ASGI, for sync, async and class-based views (fake clock, memory broker)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core import checks
from django.http import HttpResponse
from django.test import AsyncClient, Client, override_settings

from celery_deadlines import DEADLINE_HEADER, DeadlineRefused
from celery_deadlines.checks import check_ingress, check_settings
from celery_deadlines.errors import InvalidDeadline
from celery_deadlines.middleware import DeadlineMiddleware, deadline_budget
from celery_deadlines.rules.incoming import Decision
from celery_deadlines.testing import FakeClock

UNTRUSTED = "203.0.113.9"

pytestmark = pytest.mark.usefixtures("clock")


@pytest.fixture(autouse=True)
def ingress_settings() -> Iterator[None]:
    """The test views behind the middleware alone; the test client (127.0.0.1) is a
    trusted proxy."""
    with override_settings(
        ROOT_URLCONF="tests.support.ingress_urls",
        MIDDLEWARE=["celery_deadlines.middleware.DeadlineMiddleware"],
        CELERY_DEADLINES_TRUSTED_PROXIES=["127.0.0.0/8"],
        CELERY_DEADLINES_REQUEST_HEADERS={
            "grpc-timeout": "grpc-timeout",
            "X-Request-Timeout-Ms": "milliseconds",
            "X-Request-Deadline": "rfc3339",
        },
        CELERY_DEADLINES_REQUEST_BUDGETS={"ingress:named": 6, "/api/*": 12},
        CELERY_DEADLINES_REMAINING_HEADER=None,  # the default (the demo's settings ask)
    ):
        yield


def get(path: str, *, remote: str = "127.0.0.1", **headers: str) -> Any:
    return Client(REMOTE_ADDR=remote).get(path, headers=headers)


def get_async(path: str, *, remote: str = "127.0.0.1", **headers: str) -> Any:
    async def call() -> Any:
        return await AsyncClient(REMOTE_ADDR=remote).get(path, headers=headers)

    return asyncio.run(call())


def answered(response: Any, published: list[dict[str, Any]]) -> float | None:
    """The deadline the view saw, checked against the one its task carried."""
    assert response.status_code == 200
    seen = response.json()
    (message,) = [m for m in published if m["id"] == seen["task_id"]]
    assert message.get(DEADLINE_HEADER) == seen["deadline"]
    deadline: float | None = seen["deadline"]
    return deadline


@pytest.mark.parametrize("call", [get, get_async], ids=["wsgi", "asgi"])
@pytest.mark.parametrize(
    ("path", "budget"),
    [
        ("/budgeted/", 60),  # the decorator
        ("/async/", 60),  # the decorator, on an async view
        ("/class/", 4),  # the decorator, on a class-based view
        ("/named/", 6),  # the URL name, namespaced
        ("/api/report/", 12),  # a path pattern
    ],
)
def test_a_task_published_from_a_view_inherits_the_requests_deadline(
    call: Any, path: str, budget: int, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    deadline = answered(call(path), published)
    assert deadline == (clock.now() + timedelta(seconds=budget)).timestamp()


@pytest.mark.parametrize(
    "middleware",
    [
        ["celery_deadlines.middleware.DeadlineMiddleware", "tests.support.ingress_urls.sync_only"],
        ["tests.support.ingress_urls.sync_only", "celery_deadlines.middleware.DeadlineMiddleware"],
    ],
    ids=["before", "after"],
)
@pytest.mark.parametrize("path", ["/budgeted/", "/async/"])
def test_a_sync_only_middleware_beside_it_under_asgi_changes_nothing(
    middleware: list[str], path: str, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    with override_settings(MIDDLEWARE=middleware):
        deadline = answered(get_async(path, **{"grpc-timeout": "2S"}), published)
    assert deadline == (clock.now() + timedelta(seconds=2)).timestamp()


@pytest.mark.parametrize("call", [get, get_async], ids=["wsgi", "asgi"])
@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("grpc-timeout", "1500m"),
        ("X-Request-Timeout-Ms", "1500"),
        ("X-Request-Deadline", "2030-01-01T12:00:01.5Z"),  # the fake clock reads 12:00
    ],
)
def test_a_trusted_header_shortens_the_views_budget(
    call: Any, header: str, value: str, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    deadline = answered(call("/async/", **{header: value}), published)
    assert deadline == (clock.now() + timedelta(milliseconds=1500)).timestamp()


@pytest.mark.parametrize(
    ("remote", "value", "why"),
    [
        (UNTRUSTED, "1S", "untrusted"),
        ("127.0.0.1", "90S", "later"),
        ("127.0.0.1", "1 second", "malformed"),
        ("127.0.0.1", "99999999H", "absurd"),
    ],
)
def test_a_hostile_header_is_ignored_with_a_logged_reason_and_the_request_succeeds(
    remote: str,
    value: str,
    why: str,
    clock: FakeClock,
    published: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="celery_deadlines"):
        deadline = answered(get("/budgeted/", remote=remote, **{"grpc-timeout": value}), published)
    assert deadline == (clock.now() + timedelta(seconds=60)).timestamp()
    assert f"from {remote} ignored ({why})" in caplog.text


def test_a_request_without_a_budget_opens_no_scope(published: list[dict[str, Any]]) -> None:
    assert answered(get("/unbudgeted/", **{"grpc-timeout": "1S"}), published) is None
    assert answered(get("/opted-out/"), published) is None


@pytest.mark.parametrize("call", [get, get_async], ids=["wsgi", "asgi"])
@pytest.mark.parametrize("path", ["/decided/", "/decided-async/"])
def test_a_view_reads_the_requests_deadline_its_source_and_the_time_left(
    call: Any, path: str, clock: FakeClock
) -> None:
    headers = {"grpc-timeout": "3S", "X-Request-Timeout-Ms": "soon"}
    seen = call(path, **headers).json()
    assert seen == {
        "deadline": (clock.now() + timedelta(seconds=3)).timestamp(),
        "source": "header grpc-timeout",
        "left": 3.0,
        "ignored": ["x-request-timeout-ms"],  # malformed
        "inherited": seen["deadline"],  # what its tasks inherit
    }
    assert call(path).json()["source"] == "view"  # its own budget, 8 s
    assert call(path).json()["left"] == 8.0


def test_a_view_without_a_budget_reads_no_deadline() -> None:
    seen = get("/decided-none/").json()
    assert seen == {
        "deadline": None,
        "source": None,
        "left": None,
        "ignored": [],
        "inherited": None,
    }


def test_the_default_request_budget_covers_views_without_one_but_not_opted_out_ones(
    clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    with override_settings(CELERY_DEADLINES_REQUEST_BUDGET=20):
        unbudgeted = answered(get("/unbudgeted/"), published)
        opted_out = answered(get("/opted-out/"), published)
    assert unbudgeted == (clock.now() + timedelta(seconds=20)).timestamp()
    assert opted_out is None


def test_an_unknown_path_gets_the_default_request_budget_and_its_404(clock: FakeClock) -> None:
    with override_settings(CELERY_DEADLINES_REQUEST_BUDGET=20, DEBUG=False):
        assert get("/nowhere/").status_code == 404


@pytest.mark.parametrize("call", [get, get_async], ids=["wsgi", "asgi"])
def test_the_response_says_how_much_budget_was_left_only_when_asked(
    call: Any, clock: FakeClock
) -> None:
    assert "X-Deadline-Remaining-Ms" not in call("/budgeted/")
    with override_settings(CELERY_DEADLINES_REMAINING_HEADER="X-Deadline-Remaining-Ms"):
        assert call("/budgeted/")["X-Deadline-Remaining-Ms"] == "60000"
        assert call("/budgeted/", **{"grpc-timeout": "250m"})["X-Deadline-Remaining-Ms"] == "250"
        assert "X-Deadline-Remaining-Ms" not in call("/unbudgeted/")


def test_a_response_ready_after_the_deadline_says_no_time_was_left(clock: FakeClock) -> None:
    middleware = DeadlineMiddleware(lambda request: HttpResponse())
    past = Decision(clock.now() - timedelta(seconds=2), "view")
    with override_settings(CELERY_DEADLINES_REMAINING_HEADER="X-Deadline-Remaining-Ms"):
        assert middleware._finish(HttpResponse(), past)["X-Deadline-Remaining-Ms"] == "0"


def test_a_deadline_already_spent_upstream_refuses_the_views_publish() -> None:
    """The view inherits a deadline with no time left: the enqueue gate refuses its
    task at once, as it would a child of a task whose deadline passed (the view may
    catch DeadlineRefused and answer 504)."""
    with pytest.raises(DeadlineRefused, match="deadline_passed"):
        get("/budgeted/", **{"grpc-timeout": "0m"})


def test_a_view_that_fails_leaves_no_scope_behind(published: list[dict[str, Any]]) -> None:
    with pytest.raises(RuntimeError, match="the view failed"):
        get("/broken/")
    assert answered(get("/unbudgeted/"), published) is None


def test_a_bad_decorator_budget_fails_at_import() -> None:
    for bad in (0, -1, "8", float("inf")):
        with pytest.raises(InvalidDeadline):
            deadline_budget(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "value", "complaint"),
    [
        ("CELERY_DEADLINES_TRUSTED_PROXIES", "10.0.0.0/8", "must be a list"),
        ("CELERY_DEADLINES_TRUSTED_PROXIES", ["10.0.0.0/33"], "not an address or network"),
        ("CELERY_DEADLINES_REQUEST_HEADERS", {"grpc-timeout": "grpc"}, "must be one of"),
        ("CELERY_DEADLINES_REQUEST_HEADERS", {"bad header": "rfc3339"}, "header name"),
        ("CELERY_DEADLINES_REQUEST_BUDGETS", {"shop:checkout": -1}, "more than zero"),
        ("CELERY_DEADLINES_REQUEST_BUDGET", "10s", "number of seconds"),
        ("CELERY_DEADLINES_REMAINING_HEADER", "X Remaining", "header name"),
    ],
)
def test_a_bad_request_setting_is_a_check_error_naming_it(
    name: str, value: object, complaint: str
) -> None:
    with override_settings(**{name: value}):
        found = check_settings(None)
    assert [message.id for message in found] == ["celery_deadlines.E001"]
    assert isinstance(found[0], checks.Error)
    assert name in found[0].msg
    assert complaint in found[0].msg


def test_the_test_settings_pass_the_request_checks() -> None:
    assert check_ingress(None) == []


def test_request_settings_without_the_middleware_are_a_warning() -> None:
    with override_settings(MIDDLEWARE=[]):
        found = check_ingress(None)
    assert [message.id for message in found] == ["celery_deadlines.W004"]
    assert "CELERY_DEADLINES_REQUEST_BUDGETS, CELERY_DEADLINES_REQUEST_HEADERS" in found[0].msg


def test_deadline_headers_without_a_trusted_proxy_are_a_warning() -> None:
    with override_settings(CELERY_DEADLINES_TRUSTED_PROXIES=[]):
        found = check_ingress(None)
    assert [message.id for message in found] == ["celery_deadlines.W005"]
    assert "grpc-timeout, x-request-timeout-ms, x-request-deadline" in found[0].msg


def test_the_request_span_carries_the_requests_deadline_and_its_source(clock: FakeClock) -> None:
    # the span opentelemetry-instrumentation-django makes current around the middleware
    from opentelemetry import trace

    from celery_deadlines.contrib.opentelemetry import DEADLINE, DEADLINE_SOURCE, REMAINING
    from tests.support.otel import memory_exporter

    spans = memory_exporter()
    spans.clear()
    with trace.get_tracer("test").start_as_current_span("GET /async/"):
        response = get("/async/", **{"grpc-timeout": "1500m"})
    assert response.status_code == 200
    (span,) = [s for s in spans.get_finished_spans() if s.name == "GET /async/"]
    attributes = span.attributes or {}
    assert attributes[DEADLINE] == (clock.now() + timedelta(milliseconds=1500)).isoformat()
    assert attributes[DEADLINE_SOURCE] == "header grpc-timeout"  # it shortened the view's 60 s
    assert attributes[REMAINING] == 1.5
    spans.clear()
