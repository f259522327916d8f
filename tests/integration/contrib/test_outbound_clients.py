"""Each client adapter against a real, slow service on loopback (the real clock): the call
is cut when its time is up, with the client's own timeout error, whatever timeout the
caller gave, and the service received the deadline. A service that answers slowly, byte
by byte, is cut too (httpx: every phase is given what is left of the call).

The services run in this process's threads, on ports the system picks; each slow one
holds its answer until the test ends. (On a fake clock:
tests/unit/contrib/test_outbound_clients.py.)
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import httpx
import pytest
import requests

from celery_deadlines import deadline_scope
from celery_deadlines.contrib.grpc import DeadlineInterceptor
from celery_deadlines.contrib.httpx import async_deadline_hooks, deadline_hooks
from celery_deadlines.contrib.requests import DeadlineAdapter
from celery_deadlines.rules.outgoing import format_rfc3339

pytestmark = pytest.mark.integration

#: The scope's budget: long enough for a loaded machine to send the call, far shorter
#: than the callers' own timeouts (30 s) and than the slow services take (until the end).
BUDGET = 1.5
#: How long a slow service would take: far past the deadline (without the deadline, a
#: call would take this long, and then fail the test).
FOREVER = 20.0


class Service(BaseHTTPRequestHandler):
    """``/echo``: the request's headers, as JSON. ``/hang``: no answer. ``/trickle``: a
    chunked answer, one byte every 50 ms, for :data:`FOREVER`."""

    protocol_version = "HTTP/1.1"
    released: threading.Event
    received: list[dict[str, str]]

    def log_message(self, format: str, *args: Any) -> None:  # the test reads what it needs
        pass

    def do_GET(self) -> None:
        self.received.append({k.lower(): v for k, v in self.headers.items()})
        if self.path == "/hang":
            self.released.wait(FOREVER)
            return
        if self.path == "/trickle":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for _ in range(int(FOREVER / 0.05)):
                if self.released.wait(0.05):  # creates the slowness under test
                    return
                try:
                    self.wfile.write(b"1\r\nx\r\n")
                    self.wfile.flush()
                except OSError:  # the client gave up
                    return
            self.wfile.write(b"0\r\n\r\n")
            return
        body = json.dumps(self.received[-1]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def service() -> Iterator[tuple[str, list[dict[str, str]]]]:
    released = threading.Event()
    received: list[dict[str, str]] = []
    handler = type("Handler", (Service,), {"released": released, "received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    released.set()
    server.shutdown()
    server.server_close()


def test_an_httpx_call_to_a_service_that_trickles_its_answer_is_cut_when_its_time_is_up(
    service: tuple[str, list[dict[str, str]]],
) -> None:
    url, received = service
    chunks: list[bytes] = []
    with (
        httpx.Client(event_hooks=deadline_hooks(), timeout=30) as client,
        deadline_scope(budget=BUDGET) as scope,
        client.stream("GET", f"{url}/trickle") as response,
        pytest.raises(httpx.ReadTimeout),
    ):
        chunks.extend(response.iter_raw())  # each read gets a byte within 50 ms
    assert response.status_code == 200
    assert chunks  # cut in the middle of the answer, not before it
    assert scope.deadline is not None
    assert received[0]["x-request-deadline"] == format_rfc3339(scope.deadline)


def test_an_async_httpx_call_to_a_service_that_trickles_its_answer_is_cut_too(
    service: tuple[str, list[dict[str, str]]],
) -> None:
    url, _ = service

    async def call() -> list[bytes]:
        chunks: list[bytes] = []
        async with (
            httpx.AsyncClient(event_hooks=async_deadline_hooks(), timeout=30) as client,
            client.stream("GET", f"{url}/trickle") as response,
        ):
            try:
                async for chunk in response.aiter_raw():
                    chunks.append(chunk)
            except httpx.ReadTimeout:
                return chunks
        raise AssertionError("the whole answer was read: the call outlived its deadline")

    with deadline_scope(budget=BUDGET):
        assert asyncio.run(call())


def test_a_requests_call_to_a_service_that_does_not_answer_is_cut_when_its_time_is_up(
    service: tuple[str, list[dict[str, str]]],
) -> None:
    url, received = service
    session = requests.Session()
    session.mount("http://", DeadlineAdapter())
    with deadline_scope(budget=BUDGET) as scope, pytest.raises(requests.exceptions.ReadTimeout):
        session.get(f"{url}/hang", timeout=30)
    assert scope.deadline is not None
    (headers,) = received
    assert headers["x-request-deadline"] == format_rfc3339(scope.deadline)
    assert 0 < int(headers["x-request-timeout-ms"]) <= BUDGET * 1000


# -- gRPC ----------------------------------------------------------------------------------------


@pytest.fixture
def grpc_service() -> Iterator[tuple[str, list[float | None]]]:
    """``/t.Service/Deadline``: what the server knows of the call's deadline (JSON);
    ``/t.Service/Hang``: no answer, after recording the time the call had left."""
    released = threading.Event()
    hung: list[float | None] = []

    def deadline(request: bytes, context: grpc.ServicerContext) -> bytes:
        seen = {
            "time_remaining": context.time_remaining(),
            "metadata": dict(context.invocation_metadata()),
        }
        return json.dumps(seen).encode()

    def hang(request: bytes, context: grpc.ServicerContext) -> bytes:
        hung.append(context.time_remaining())
        released.wait(FOREVER)
        return b""

    handlers = grpc.method_handlers_generic_handler(
        "t.Service",
        {
            "Deadline": grpc.unary_unary_rpc_method_handler(deadline),
            "Hang": grpc.unary_unary_rpc_method_handler(hang),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[handlers])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", hung
    released.set()
    server.stop(None)


def test_a_grpc_server_receives_the_calls_capped_deadline_and_the_deadline_itself(
    grpc_service: tuple[str, list[float | None]],
) -> None:
    address, _ = grpc_service
    channel = grpc.intercept_channel(grpc.insecure_channel(address), DeadlineInterceptor())
    ask: Any = channel.unary_unary("/t.Service/Deadline")
    with deadline_scope(budget=BUDGET) as scope:
        seen = json.loads(ask(b"", timeout=30))
    channel.close()
    assert scope.deadline is not None
    assert 0 < seen["time_remaining"] <= BUDGET - 0.1  # grpc-timeout: the capped timeout
    assert seen["metadata"]["x-request-deadline"] == format_rfc3339(scope.deadline)


def test_a_grpc_call_to_a_server_that_does_not_answer_ends_deadline_exceeded_in_time(
    grpc_service: tuple[str, list[float | None]],
) -> None:
    address, hung = grpc_service
    channel = grpc.intercept_channel(grpc.insecure_channel(address), DeadlineInterceptor())
    hang: Any = channel.unary_unary("/t.Service/Hang")
    with deadline_scope(budget=BUDGET), pytest.raises(grpc.RpcError) as failed:
        hang(b"", timeout=30)
    channel.close()
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    (left,) = hung  # the server was told the capped time, not the caller's 30 s
    assert left is not None
    assert 0 < left <= BUDGET - 0.1
