"""A client library's own retries under the caller's deadline, on a real worker.

A ``celery worker`` (tests/support/outbound_retryapp.py, the plain tier on Redis) runs a
DeadlineTask whose body calls a real local service through a client that retries on
its own: urllib3's ``Retry`` under requests (status retries after a ``Retry-After`` or
a backoff, read retries), httpcore's connect retries under httpx, a gRPC retry policy.
Every attempt the client makes must carry the deadline as of its own instant, be cut by
what is left then, and never start with no more than the reserve left; a pause before a
retry that would leave no more than that is refused before it is slept.

The HTTP service is the Django service of tests/support/outbound_server.py, keeping each
request it receives (its arrival by the wall clock, the headers as they came); the
service that comes up late (httpx) and the gRPC server run in this process's threads.
The test names each call's deadline, so it knows when the call's time is up (the
deadline less the reserve) and judges the attempts by their arrival instants, against
margins derived from the reserve and the pauses.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent import futures
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from celery_deadlines.rules.incoming import parse_grpc_timeout, parse_milliseconds
from celery_deadlines.rules.outgoing import format_rfc3339
from tests.integration.conftest import SharedWorkers, client_for, require, transport_named
from tests.support import outbound_retryapp
from tests.support.outbound_server import serving
from tests.support.processes import Transport, WorkerProcess

pytestmark = pytest.mark.integration

#: The call's deadline is this far from the publish: time for the worker to take the
#: task on a busy machine; the body then waits until only the test's ``left`` remains.
BUDGET = 5.0
#: What each call leaves its task (``reserve=``): no attempt may start with this left.
RESERVE = 0.3
#: The worker's clocks and the service's, on one machine (and a request's way over
#: loopback): what their readings of one instant may differ by.
CLOCKS = 0.05


@pytest.fixture(scope="module")
def worker(shared_workers: SharedWorkers) -> tuple[Transport, str, WorkerProcess]:
    def start(folder: Path, queue: str) -> tuple[Transport, WorkerProcess]:
        transport = transport_named("redis", folder)
        require(transport)
        log = folder / "worker.log"
        app_module = "tests.support.outbound_retryapp"
        return transport, WorkerProcess(transport, queue, log, concurrency=2, app_module=app_module)

    shared = shared_workers.get("redis", start)
    return shared.transport, shared.queue, shared.worker


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Django service: its base URL."""
    log_path = tmp_path_factory.mktemp("outbound-service") / "service.log"
    with serving({}, log_path) as url:
        yield url


def call(
    worker: tuple[Transport, str, WorkerProcess],
    task: Any,
    *args: Any,
    deadline: datetime | None = None,
) -> tuple[dict[str, Any], datetime]:
    """Run ``task(*args)`` on the worker under ``deadline`` (default: :data:`BUDGET` from
    now): what the body answered, and the deadline."""
    transport, queue, process = worker
    deadline = deadline or datetime.now(UTC) + timedelta(seconds=BUDGET)
    with client_for(transport, queue, app=outbound_retryapp.app):
        result = task.apply_async(args, deadline=deadline)
        try:
            return result.get(timeout=BUDGET + 30), deadline
        except Exception:
            print(f"--- worker.log ---\n{process.log()}")
            raise


def seen_by(service: str, key: str) -> list[dict[str, Any]]:
    """The requests the Django service received under ``key``, in order."""
    requests: list[dict[str, Any]] = httpx.get(f"{service}/seen/{key}/").json()["requests"]
    return requests


def told(arrival: dict[str, Any]) -> list[float]:
    """The deadlines (epoch seconds) a request's relative headers told the service when
    it arrived: its arrival plus the time each said was left."""
    at: float = arrival["at"]
    return [
        at + parse_milliseconds(arrival["x-request-timeout-ms"]) / 1000,
        at + parse_grpc_timeout(arrival["grpc-timeout"]).total_seconds(),
    ]


def assert_each_attempt_in_time_and_told_its_own_deadline(
    attempts: list[dict[str, Any]], deadline: datetime
) -> None:
    limit = deadline.timestamp() - RESERVE  # the call's time is up
    for attempt in attempts:
        # none started with no more than the reserve left
        assert attempt["at"] <= limit + CLOCKS, (attempt, limit)
        # each told the service the time left at its own instant, rounded down
        for said in told(attempt):
            assert said <= deadline.timestamp() + CLOCKS, (attempt, said, deadline)
        assert attempt["x-request-deadline"] == format_rfc3339(deadline)


# -- requests: urllib3's Retry -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retry", "query"),
    [
        # 503 with Retry-After: 1; a retry after each (four attempts at 0, 1, 2, 3 s)
        pytest.param({"total": 3, "status_forcelist": [503]}, "?retry_after=1", id="retry-after"),
        # 503 alone: urllib3's backoff, 0, 0.4, 0.8, 1.6 s (attempts at 0, 0, 0.4, 1.2, 2.8 s)
        pytest.param(
            {"total": 4, "status_forcelist": [503], "backoff_factor": 0.2}, "", id="backoff"
        ),
    ],
)
def test_urllib3s_status_retries_each_carry_their_own_deadline_and_none_pauses_past_it(
    worker: tuple[Transport, str, WorkerProcess],
    service: str,
    retry: dict[str, Any],
    query: str,
) -> None:
    key = uuid.uuid4().hex
    # Given a call started with 1.8 s left, to a service that answers 503 every time
    ended, deadline = call(
        worker,
        outbound_retryapp.requests_retrying,
        f"{service}/unavailable/{key}/{query}",
        retry,
        1.8,
        RESERVE,
    )
    attempts = seen_by(service, key)
    # Then urllib3 retried (the first pauses fit in the time left)
    assert len(attempts) >= 2, attempts
    # and each attempt carried the deadline as of its own instant, in time
    assert_each_attempt_in_time_and_told_its_own_deadline(attempts, deadline)
    # And the retry whose pause would have left no more than the reserve was refused
    # before the pause: the call ended before the deadline, not after its retries
    assert ended.get("refused") == ["outbound", "insufficient_budget"], ended
    assert "retry pause" in ended["detail"]
    assert ended["remaining"] > 0, ended


def test_urllib3s_read_retries_are_cut_by_the_deadline_and_none_starts_past_it(
    worker: tuple[Transport, str, WorkerProcess], service: str
) -> None:
    key = uuid.uuid4().hex
    # Given a call started with 1.5 s left, to a service that does not answer, whose
    # client retries a read that timed out twice (Retry(read=2), its own timeout 30 s)
    ended, deadline = call(
        worker,
        outbound_retryapp.requests_retrying,
        f"{service}/stall/{key}/",
        {"read": 2},
        1.5,
        RESERVE,
    )
    # Then its first attempt's read was cut when the call's time was up, and the retry,
    # which would have started with no more than the reserve left, was never sent
    (attempt,) = seen_by(service, key)
    assert_each_attempt_in_time_and_told_its_own_deadline([attempt], deadline)
    assert ended.get("refused") == ["outbound", "insufficient_budget"], ended
    assert ended["remaining"] > 0, ended


# -- httpx: httpcore's connect retries -----------------------------------------------------------


class LateService:
    """An HTTP service on a port bound now and listening only from an instant on: until
    then a connection is refused (httpcore retries it). It answers 200 and keeps the
    arrival of each request."""

    def __init__(self) -> None:
        arrivals: list[float] = []
        self.arrivals = arrivals

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                arrivals.append(time.time())
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
        self.server.server_bind()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread: threading.Thread | None = None

    def open_at(self, instant: datetime) -> None:
        def serve() -> None:
            time.sleep(max(0.0, instant.timestamp() - time.time()))  # the delay under test
            self.server.server_activate()
            self.server.serve_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        if self.thread is not None:
            self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def late_service() -> Iterator[LateService]:
    service = LateService()
    yield service
    service.close()


def test_httpcores_connect_retries_pause_only_while_the_attempt_after_can_start_in_time(
    worker: tuple[Transport, str, WorkerProcess], late_service: LateService
) -> None:
    # Given a service that listens only from the call's deadline on, called with 1.4 s
    # left on a transport that retries a refused connection six times (httpcore pauses
    # 0, 0.5, 1, 2, 4, 8 s before them: attempts at 0, 0, 0.5, 1.5, 3.5... s)
    deadline = datetime.now(UTC) + timedelta(seconds=BUDGET)
    late_service.open_at(deadline)
    ended, _ = call(
        worker,
        outbound_retryapp.httpx_retrying,
        late_service.url,
        6,
        1.4,
        RESERVE,
        deadline=deadline,
    )
    # Then the retry after the 1 s pause, which would have started past the call's
    # time, was refused before the pause: the call ended before the deadline
    assert ended.get("refused") == ["outbound", "insufficient_budget"], ended
    assert "retry pause of 1.000 s" in ended["detail"]
    assert ended["remaining"] > 0, ended
    # and no attempt reached the service (it listened from the deadline on)
    assert late_service.arrivals == []


# -- gRPC: a service config's retry policy -------------------------------------------------------

#: gRPC retries UNAVAILABLE up to five attempts; the server's pushback sets each pause
RETRY_POLICY = {
    "maxAttempts": 5,
    "initialBackoff": "0.1s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
PUSHBACK_MS = 300


@pytest.fixture
def flaky_grpc() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """``/t.Service/Flaky``: UNAVAILABLE every time, with a pushback of
    :data:`PUSHBACK_MS` (gRPC retries after exactly that), keeping each attempt's
    arrival, the time gRPC told it was left, and its metadata."""
    attempts: list[dict[str, Any]] = []

    def flaky(request: bytes, context: grpc.ServicerContext) -> bytes:
        attempts.append(
            {
                "at": time.time(),
                "time_remaining": context.time_remaining(),
                "metadata": dict(context.invocation_metadata()),
            }
        )
        context.set_trailing_metadata((("grpc-retry-pushback-ms", str(PUSHBACK_MS)),))
        context.abort(grpc.StatusCode.UNAVAILABLE, "try again")

    handlers = grpc.method_handlers_generic_handler(
        "t.Service", {"Flaky": grpc.unary_unary_rpc_method_handler(flaky)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[handlers])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", attempts
    server.stop(None)


def test_a_grpc_retry_policy_starts_no_attempt_past_the_deadline_and_tells_each_its_own_time(
    worker: tuple[Transport, str, WorkerProcess], flaky_grpc: tuple[str, list[dict[str, Any]]]
) -> None:
    address, attempts = flaky_grpc
    # Given a call started with 1.2 s left, that gRPC retries 0.3 s after each failure
    ended, deadline = call(
        worker, outbound_retryapp.grpc_retrying, address, RETRY_POLICY, 1.2, RESERVE
    )
    # Then gRPC retried while the call had time, and ended it at its deadline (the
    # task's less the reserve), not after its five attempts
    assert len(attempts) >= 2, attempts
    assert ended.get("failed") == "DEADLINE_EXCEEDED", ended
    assert ended["remaining"] > 0, ended
    limit = deadline.timestamp() - RESERVE
    for attempt in attempts:
        # gRPC's own deadline holds every attempt: none started past it, and each was
        # told (grpc-timeout, written afresh per attempt) no more than was left then
        assert attempt["at"] <= limit + CLOCKS, (attempt, limit)
        assert attempt["at"] + attempt["time_remaining"] <= limit + CLOCKS, (attempt, limit)
        # the metadata gRPC sends again unchanged says the deadline as an instant only
        metadata = attempt["metadata"]
        assert metadata["x-request-deadline"] == format_rfc3339(deadline)
        assert "x-request-timeout-ms" not in metadata, (attempt, deadline)
