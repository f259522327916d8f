"""The deadline starts at the HTTP request: a task a Django view publishes reaches a real
``celery worker`` (Redis) carrying the request's deadline.

The views (tests/support/ingress_urls.py) run in this process behind DeadlineMiddleware,
through Django's test clients (WSGI and ASGI); each publishes ``t.probe``, which the
module's one worker runs and answers with the deadline header it received and the time
it had left. The test client's address (127.0.0.1) is the trusted proxy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import AsyncClient, Client, override_settings

from tests.integration.conftest import (
    Shared,
    SharedWorkers,
    client_for,
    logs_on_failure,
    redis_transport,
    require,
)
from tests.support import ingress_urls
from tests.support.processes import Transport, WorkerProcess

pytestmark = pytest.mark.integration

TRUSTED, UNTRUSTED = "127.0.0.1", "203.0.113.9"
BUDGET = 60.0  # the views' @deadline_budget(60)
SHORTER = 30.0  # what the trusted header leaves: far more than a loaded worker needs
#: datetime.now() rounds to the microsecond, time.time() does not
ROUNDING = 1e-3


def start(folder: Any, queue: str) -> tuple[Transport, WorkerProcess]:
    transport = redis_transport()
    require(transport)
    return transport, WorkerProcess(transport, queue, folder / "worker.log", concurrency=2)


@pytest.fixture
def worker(request: pytest.FixtureRequest, shared_workers: SharedWorkers) -> Iterator[Shared]:
    """The module's worker; the views publish to its queue, behind the middleware."""
    shared = shared_workers.get("redis", start)
    with (
        logs_on_failure(request, shared.worker),
        client_for(shared.transport, shared.queue, app=ingress_urls.app),
        override_settings(
            ROOT_URLCONF="tests.support.ingress_urls",
            MIDDLEWARE=["celery_deadlines.middleware.DeadlineMiddleware"],
            CELERY_DEADLINES_TRUSTED_PROXIES=[TRUSTED],
            CELERY_DEADLINES_REQUEST_HEADERS={
                "grpc-timeout": "grpc-timeout",
                "X-Request-Deadline": "rfc3339",
            },
        ),
    ):
        yield shared


def request(path: str, remote: str, headers: dict[str, str], *, asgi: bool) -> Any:
    if asgi:

        async def call() -> Any:
            return await AsyncClient(REMOTE_ADDR=remote).get(path, headers=headers)

        return asyncio.run(call())
    return Client(REMOTE_ADDR=remote).get(path, headers=headers)


@pytest.mark.parametrize(
    ("path", "remote", "headers", "allowed"),
    [
        pytest.param("/budgeted/", TRUSTED, {}, BUDGET, id="the view's budget"),
        pytest.param("/async/", TRUSTED, {}, BUDGET, id="the async view's budget (asgi)"),
        pytest.param(
            "/async/", TRUSTED, {"grpc-timeout": "30S"}, SHORTER, id="a trusted header (asgi)"
        ),
        pytest.param(
            "/budgeted/", TRUSTED, {"grpc-timeout": "30S"}, SHORTER, id="a trusted header"
        ),
        pytest.param(
            "/budgeted/", UNTRUSTED, {"grpc-timeout": "30S"}, BUDGET, id="an untrusted peer"
        ),
        pytest.param("/budgeted/", TRUSTED, {"grpc-timeout": "90S"}, BUDGET, id="extending"),
        pytest.param("/budgeted/", TRUSTED, {"grpc-timeout": "3 seconds"}, BUDGET, id="malformed"),
        pytest.param(
            "/budgeted/",
            TRUSTED,
            {"X-Request-Deadline": "9999-12-31T23:59:59Z"},
            BUDGET,
            id="absurd",
        ),
    ],
)
def test_a_task_started_from_a_view_runs_under_the_requests_deadline(
    worker: Shared, path: str, remote: str, headers: dict[str, str], allowed: float
) -> None:
    # Given a request whose deadline is its view's budget, or a trusted header's shorter one
    before = time.time()
    response = request(path, remote, headers, asgi=path == "/async/")
    after = time.time()
    # Then the request succeeds, whatever its headers said
    assert response.status_code == 200
    seen = response.json()
    assert before + allowed - ROUNDING <= seen["deadline"] <= after + allowed + ROUNDING
    # And the worker ran the task it published under that same deadline
    ran = ingress_urls.app.AsyncResult(seen["task_id"]).get(timeout=20)
    assert ran["deadline"] == seen["deadline"]
    assert ran["source"] == "scope"
    assert 0 < ran["remaining"] <= allowed
