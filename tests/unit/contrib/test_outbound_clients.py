"""The client adapters on a fake clock: httpx's request hooks, requests' adapter and the
gRPC interceptor add the deadline's headers, cap each call's timeout, and refuse a call
that cannot finish before anything reaches the network (a listening socket that no
connection reaches); each attempt a client makes by itself (urllib3's retries,
httpcore's connect retries, on their own code with the network scripted) is held to the
same deadline, and so is each pause before one. Their timeouts against real, slow
services: tests/integration/contrib/test_outbound_clients.py; the retries on a real worker:
tests/integration/contrib/test_outbound_retries.py."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpcore
import httpx
import pytest
import requests
import urllib3
from celery import Celery
from requests.adapters import HTTPAdapter
from urllib3.util import Retry, Timeout

from celery_deadlines import DeadlineRefused, deadline_scope
from celery_deadlines.contrib.grpc import DeadlineInterceptor
from celery_deadlines.contrib.httpx import async_deadline_hooks, deadline_hooks
from celery_deadlines.contrib.requests import DeadlineAdapter
from celery_deadlines.rules.gates import Decision
from celery_deadlines.testing import FakeClock

DEADLINE = "2030-01-01T12:00:05.000000Z"  # the fake clock's start, plus the scope's 5 s
RESERVE = 0.1  # deadlines_outbound_reserve's default


# -- httpx ---------------------------------------------------------------------------------------


class Seen:
    """What an httpx transport was handed: the requests, and each one's timeouts as
    httpcore reads them (at that moment)."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200)

    def read(self, phase: str, index: int = -1) -> Any:
        return self.requests[index].extensions["timeout"].get(phase)


def test_an_httpx_request_carries_the_deadline_and_its_timeouts_are_capped(
    app: Celery, clock: FakeClock
) -> None:
    seen = Seen()
    client = httpx.Client(transport=httpx.MockTransport(seen), event_hooks=deadline_hooks())
    with deadline_scope(budget=5, app=app):
        client.get("http://api.example/a", headers={"X-Request-Deadline": "forged"}, timeout=60)
        client.get("http://api.example/b", timeout=httpx.Timeout(60, read=2))
    first, _ = seen.requests
    assert first.headers["grpc-timeout"] == "5000000u"
    assert first.headers["x-request-timeout-ms"] == "5000"
    assert first.headers.get_list("x-request-deadline") == [DEADLINE]  # ours, never a caller's
    assert {phase: seen.read(phase, 0) for phase in ("connect", "read", "write", "pool")} == {
        phase: pytest.approx(5 - RESERVE) for phase in ("connect", "read", "write", "pool")
    }
    assert seen.read("read", 1) == 2  # a shorter timeout of the caller's own is kept
    assert seen.read("connect", 1) == pytest.approx(5 - RESERVE)


def test_each_phase_of_an_httpx_call_gets_what_is_left_when_it_starts(
    app: Celery, clock: FakeClock
) -> None:
    """httpcore reads the request's timeouts at each network operation: a read that
    starts late in the call is given only what is left of it then."""
    seen = Seen()
    client = httpx.Client(transport=httpx.MockTransport(seen), event_hooks=deadline_hooks())
    with deadline_scope(budget=5, app=app):
        client.get("http://api.example/", timeout=60)
    assert seen.read("read") == pytest.approx(4.9)
    clock.advance(3)
    assert seen.read("read") == pytest.approx(1.9)
    assert seen.requests[-1].extensions["timeout"]["write"] == pytest.approx(1.9)
    clock.advance(2)
    assert seen.read("read") == 1e-6  # the call's time is up: its timeout error, at once


def test_an_httpx_answer_still_arriving_when_the_calls_time_is_up_is_cut_between_chunks(
    app: Celery, clock: FakeClock
) -> None:
    def body() -> Iterator[bytes]:
        yield b"a"
        clock.advance(5)  # the service trickles the rest, past the call's time
        yield b"b"
        yield b"c"

    client = httpx.Client(
        transport=httpx.MockTransport(lambda request: httpx.Response(200, content=body())),
        event_hooks=deadline_hooks(),
    )
    chunks: list[bytes] = []
    with (
        deadline_scope(budget=5, app=app),
        client.stream("GET", "http://api.example/") as response,
        pytest.raises(httpx.ReadTimeout, match="time ran out"),
    ):
        chunks.extend(response.iter_raw())
    assert chunks == [b"a"]


def test_an_httpx_request_without_a_deadline_is_sent_as_written(app: Celery) -> None:
    seen = Seen()
    client = httpx.Client(transport=httpx.MockTransport(seen), event_hooks=deadline_hooks())
    client.get("http://api.example/", timeout=60)
    (request,) = seen.requests
    assert "grpc-timeout" not in request.headers
    assert request.extensions["timeout"] == {"connect": 60, "read": 60, "write": 60, "pool": 60}


def test_every_hop_of_an_httpx_redirect_passes_the_gate(app: Celery, clock: FakeClock) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/old":
            clock.advance(2)  # the first hop took 2 s
            return httpx.Response(302, headers={"Location": "http://other.example/new"})
        return httpx.Response(200)

    sent: list[httpx.Request] = []
    hooks = deadline_hooks()
    hooks["request"].append(sent.append)
    client = httpx.Client(
        transport=httpx.MockTransport(handler), event_hooks=hooks, follow_redirects=True
    )
    with deadline_scope(budget=5, app=app):
        client.get("http://api.example/old")
    assert [r.headers["x-request-timeout-ms"] for r in sent] == ["5000", "3000"]
    assert sent[-1].extensions["timeout"].get("read") == pytest.approx(3 - RESERVE)


def test_an_httpx_call_that_cannot_finish_is_refused_before_any_byte_is_sent(
    app: Celery,
    clock: FakeClock,
    listener: tuple[str, Callable[[], bool]],
    refusals: list[Decision],
) -> None:
    address, reached = listener
    client = httpx.Client(event_hooks=deadline_hooks(reserve=2))
    with deadline_scope(budget=5, app=app):
        clock.advance(3)
        with pytest.raises(DeadlineRefused) as refused:
            client.get(f"http://{address}/")
    assert (refused.value.gate, refused.value.reason) == ("outbound", "insufficient_budget")
    assert refused.value.detail.startswith(f"GET {address}: 2.000 s left")
    assert len(refusals) == 1
    assert not reached()


def test_an_async_httpx_call_is_capped_or_refused_as_a_sync_one(
    app: Celery, clock: FakeClock, listener: tuple[str, Callable[[], bool]]
) -> None:
    address, reached = listener
    seen = Seen()

    async def calls() -> None:
        async with httpx.AsyncClient(
            transport=httpx.MockTransport(seen), event_hooks=async_deadline_hooks()
        ) as client:
            await client.get("http://api.example/", timeout=60)
        assert seen.read("pool") == pytest.approx(4.9)
        async with httpx.AsyncClient(event_hooks=async_deadline_hooks()) as client:
            clock.advance(4.95)
            await client.get(f"http://{address}/")

    with deadline_scope(budget=5, app=app), pytest.raises(DeadlineRefused):
        asyncio.run(calls())
    assert seen.requests[0].headers["x-request-deadline"] == DEADLINE
    assert not reached()


class Network:
    """httpcore's network, scripted on the fake clock: the first ``refusals`` connection
    attempts fail (each after ``connect_takes``), the next is answered 200. It keeps
    each attempt's instant and timeout, each TLS handshake's timeout, each pause httpcore
    sleeps (which takes ``overrun`` times as long: a loaded machine), and what is sent."""

    OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"

    def __init__(
        self, clock: FakeClock, refusals: int, connect_takes: float = 0.0, overrun: float = 1.0
    ) -> None:
        self.clock, self.refusals, self.connect_takes = clock, refusals, connect_takes
        self.overrun = overrun
        self.start = clock.monotonic()
        self.connects: list[tuple[float, float]] = []
        self.handshakes: list[float] = []
        self.pauses: list[float] = []
        self.sent = b""

    def connect(self, timeout: float | None) -> None:
        assert timeout is not None
        self.connects.append((self.clock.monotonic() - self.start, timeout))
        if len(self.connects) <= self.refusals:
            self.clock.advance(self.connect_takes)
            raise httpcore.ConnectError("refused")

    def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.clock.advance(seconds * self.overrun)

    def header(self, name: bytes) -> bytes:
        (value,) = [
            line.split(b": ")[1]
            for line in self.sent.split(b"\r\n")
            if line.lower().startswith(name + b":")
        ]
        return value

    def transport(self, retries: int) -> httpx.HTTPTransport:
        network = self

        class Stream(httpcore.MockStream):
            def write(self, buffer: bytes, timeout: float | None = None) -> None:
                network.sent += buffer

            def start_tls(
                self, ssl_context: Any, server_hostname: Any = None, timeout: Any = None
            ) -> Any:
                network.handshakes.append(timeout)
                return self

        class Backend(httpcore.MockBackend):
            def connect_tcp(
                self,
                host: str,
                port: int,
                timeout: float | None = None,
                local_address: str | None = None,
                socket_options: Any = None,
            ) -> Any:
                network.connect(timeout)
                return Stream([network.OK])

            def sleep(self, seconds: float) -> None:
                network.pause(seconds)

        transport = httpx.HTTPTransport(retries=retries)
        transport._pool = httpcore.ConnectionPool(retries=retries, network_backend=Backend([]))
        return transport

    def async_transport(self, retries: int) -> httpx.AsyncHTTPTransport:
        network = self

        class Stream(httpcore.AsyncMockStream):
            async def write(self, buffer: bytes, timeout: float | None = None) -> None:
                network.sent += buffer

        class Backend(httpcore.AsyncMockBackend):
            async def connect_tcp(
                self,
                host: str,
                port: int,
                timeout: float | None = None,
                local_address: str | None = None,
                socket_options: Any = None,
            ) -> Any:
                network.connect(timeout)
                return Stream([network.OK])

            async def sleep(self, seconds: float) -> None:
                network.pause(seconds)

        transport = httpx.AsyncHTTPTransport(retries=retries)
        transport._pool = httpcore.AsyncConnectionPool(retries=retries, network_backend=Backend([]))
        return transport


def test_each_of_httpcores_connect_retries_connects_with_what_is_left_and_sends_its_own_time(
    app: Celery, clock: FakeClock
) -> None:
    network = Network(clock, refusals=2, connect_takes=1.0)
    steps: list[str] = []
    client = httpx.Client(transport=network.transport(retries=3), event_hooks=deadline_hooks())
    with deadline_scope(budget=5, app=app):
        extensions = {"trace": lambda name, info: steps.append(name)}  # the caller's own
        client.get("https://api.example/", timeout=60, extensions=extensions)
    # attempts at 0, 1 s (after httpcore's pause of 0) and 2.5 s (after 0.5 s), each given
    # what is left of the call's 4.9 s then, and so is the TLS handshake after the last
    assert [at for at, _ in network.connects] == [0, 1, 2.5]
    assert [timeout for _, timeout in network.connects] == pytest.approx([4.9, 3.9, 2.4])
    assert network.pauses == [0, 0.5]
    assert network.handshakes == [pytest.approx(2.4)]
    # the request went with the time left when it was sent, not when the hook ran
    assert network.header(b"x-request-timeout-ms") == b"2500"
    assert network.header(b"grpc-timeout") == b"2500000u"
    assert steps.count("connection.retry.started") == 2  # the caller's trace still sees all


def test_a_connect_retry_whose_pause_would_leave_no_more_than_the_reserve_is_refused_before_it(
    app: Celery, clock: FakeClock, refusals: list[Decision]
) -> None:
    network = Network(clock, refusals=10)
    client = httpx.Client(
        transport=network.transport(retries=6), event_hooks=deadline_hooks(reserve=0.3)
    )
    with deadline_scope(budget=1.2, app=app), pytest.raises(DeadlineRefused) as refused:
        client.get("http://api.example/")
    # httpcore pauses 0, 0.5, then 1 s: the attempt after that would start with 0.2 s left
    assert [at for at, _ in network.connects] == [0, 0, 0.5]
    assert network.pauses == [0, 0.5]
    assert refused.value.detail.startswith(
        "GET api.example: 0.700 s left, less the client's retry pause of 1.000 s"
    )
    assert len(refusals) == 1


def test_a_connect_retry_that_would_start_with_no_more_than_the_reserve_left_is_refused(
    app: Celery, clock: FakeClock, refusals: list[Decision]
) -> None:
    # a pause judged in time that takes four times as long (a loaded machine)
    network = Network(clock, refusals=10, overrun=3.9)
    client = httpx.Client(transport=network.transport(retries=6), event_hooks=deadline_hooks())
    with deadline_scope(budget=2, app=app), pytest.raises(DeadlineRefused) as refused:
        client.get("http://api.example/")
    assert network.pauses == [0, 0.5]  # 1.95 s slept for 0.5
    assert len(network.connects) == 2  # the third was refused as it started
    assert refused.value.detail.startswith("GET api.example: 0.050 s left, not more than")
    assert len(refusals) == 1


def test_an_async_clients_connect_retries_are_held_to_the_deadline_as_a_sync_ones(
    app: Celery, clock: FakeClock, refusals: list[Decision]
) -> None:
    network = Network(clock, refusals=10)

    async def calls() -> None:
        transport = network.async_transport(retries=6)
        hooks = async_deadline_hooks(reserve=0.3)
        async with httpx.AsyncClient(transport=transport, event_hooks=hooks) as client:
            await client.get("http://api.example/")

    with deadline_scope(budget=1.2, app=app), pytest.raises(DeadlineRefused) as refused:
        asyncio.run(calls())
    assert [at for at, _ in network.connects] == [0, 0, 0.5]
    assert [timeout for _, timeout in network.connects] == pytest.approx([0.9, 0.9, 0.4])
    assert refused.value.detail.startswith("GET api.example: 0.700 s left, less the client")
    assert len(refusals) == 1


def test_hooks_with_a_bad_reserve_fail_where_the_client_is_made() -> None:
    with pytest.raises(ValueError, match="reserve"):
        deadline_hooks(reserve=-1)


# -- requests ------------------------------------------------------------------------------------


class Handed(HTTPAdapter):
    """Where DeadlineAdapter hands a request on (``HTTPAdapter.send``), recorded."""

    handed: list[tuple[requests.PreparedRequest, Any]]

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: dict[str, str] | None = None,
    ) -> requests.Response:
        self.handed.append((request, timeout))
        response = requests.Response()
        response.status_code, response.request = 200, request
        return response


class RecordedDeadlineAdapter(DeadlineAdapter, Handed):
    pass


@pytest.fixture
def session() -> tuple[requests.Session, RecordedDeadlineAdapter]:
    adapter = RecordedDeadlineAdapter()
    adapter.handed = []
    session = requests.Session()
    session.mount("http://", adapter)
    return session, adapter


@pytest.mark.parametrize(
    ("timeout", "connect", "read"),
    [
        (None, 4.9, 4.9),
        (60, 4.9, 4.9),
        ((1.5, 60), 1.5, 4.9),
        ((60, 2), 4.9, 2),
    ],
)
def test_a_requests_call_carries_the_deadline_and_its_timeouts_are_capped(
    app: Celery,
    clock: FakeClock,
    session: tuple[requests.Session, RecordedDeadlineAdapter],
    timeout: Any,
    connect: float,
    read: float,
) -> None:
    client, adapter = session
    with deadline_scope(budget=5, app=app):
        client.get("http://api.example/", headers={"grpc-timeout": "1H"}, timeout=timeout)
    ((request, sent),) = adapter.handed
    assert request.headers["grpc-timeout"] == "5000000u"  # ours, never a caller's
    assert request.headers["x-request-deadline"] == DEADLINE
    assert (sent.connect_timeout, sent.total) == (pytest.approx(connect), pytest.approx(4.9))
    sent.start_connect()  # urllib3 takes what the connection took (its own clock) from total
    assert sent.read_timeout == pytest.approx(read, abs=0.05)


def test_a_requests_call_without_a_deadline_is_sent_as_written(
    app: Celery, session: tuple[requests.Session, RecordedDeadlineAdapter]
) -> None:
    client, adapter = session
    client.get("http://api.example/", timeout=(3, 7))
    ((request, sent),) = adapter.handed
    assert "x-request-deadline" not in request.headers
    assert sent == (3, 7)


def test_a_requests_call_that_cannot_finish_is_refused_before_any_byte_is_sent(
    app: Celery, clock: FakeClock, listener: tuple[str, Callable[[], bool]]
) -> None:
    address, reached = listener
    client = requests.Session()
    client.mount("http://", DeadlineAdapter())
    with deadline_scope(budget=5, app=app):
        clock.advance(5)
        with pytest.raises(DeadlineRefused) as refused:
            client.post(f"http://user:secret@{address}/pay?card=4111", data=b"x")
    assert refused.value.reason == "deadline_passed"
    assert refused.value.detail.startswith(f"POST {address}: deadline passed")  # no secrets
    assert not reached()


class Service:
    """urllib3's own connection pool with its network step scripted on the fake clock
    (installed as the pool for ``http``; the adapter makes its own of it): each attempt
    keeps the headers and the timeouts urllib3 hands it, takes its step's time, and
    answers its step's status (with its ``Retry-After``), or its read times out. The
    pauses urllib3 sleeps are kept and taken on the fake clock too."""

    def __init__(self, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clock = clock
        self.start = clock.monotonic()
        self.steps: list[tuple[float, int | None, dict[str, str]]] = []
        self.sent: list[tuple[float, dict[str, str], Any]] = []
        self.pauses: list[float] = []
        service = self

        class Scripted(urllib3.HTTPConnectionPool):
            def _make_request(
                self,
                conn: Any,
                method: str,
                url: str,
                body: Any = None,
                headers: Any = None,
                retries: Any = None,
                timeout: Any = None,
                *args: Any,
                **kwargs: Any,
            ) -> Any:
                return service.attempt(self, method, url, headers, timeout)

        def sleep(seconds: float) -> None:
            self.pauses.append(seconds)
            clock.advance(seconds)

        monkeypatch.setitem(urllib3.poolmanager.pool_classes_by_scheme, "http", Scripted)
        monkeypatch.setattr(time, "sleep", sleep)

    def then(self, takes: float, status: int | None, **headers: str) -> Service:
        """The next attempt takes ``takes`` and answers ``status`` (``None``: its read
        times out)."""
        self.steps.append((takes, status, headers))
        return self

    def attempt(self, pool: Any, method: str, url: str, headers: Any, timeout: Any) -> Any:
        self.sent.append((self.clock.monotonic() - self.start, dict(headers), timeout))
        assert self.steps, f"an attempt past the script: {self.sent}"
        takes, status, answer = self.steps.pop(0)
        self.clock.advance(takes)
        if status is None:
            raise urllib3.exceptions.ReadTimeoutError(pool, url, "Read timed out.")
        return urllib3.HTTPResponse(
            body=io.BytesIO(b""), headers=answer, status=status, preload_content=False,
            request_method=method, request_url=url,
        )  # fmt: skip

    def session(self, retry: Retry, **adapter: Any) -> requests.Session:
        session = requests.Session()
        session.mount("http://", DeadlineAdapter(max_retries=retry, **adapter))
        return session


@pytest.fixture
def service(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> Service:
    return Service(clock, monkeypatch)


def test_each_of_urllib3s_retries_carries_the_headers_and_the_timeouts_of_its_own_instant(
    app: Celery, service: Service
) -> None:
    service.then(1, 503).then(1, 503).then(0.5, 200)
    session = service.session(Retry(total=3, status_forcelist=[503]))
    with deadline_scope(budget=5, app=app):
        assert session.get("http://api.example/", timeout=(60, 60)).status_code == 200
    assert [at for at, _, _ in service.sent] == [0, 1, 2]
    assert [headers["x-request-timeout-ms"] for _, headers, _ in service.sent] == [
        "5000",
        "4000",
        "3000",
    ]
    assert {headers["x-request-deadline"] for _, headers, _ in service.sent} == {DEADLINE}
    assert [(t.connect_timeout, t.total) for _, _, t in service.sent] == [
        (pytest.approx(left), pytest.approx(left)) for left in (4.9, 3.9, 2.9)
    ]


def test_a_retry_urllib3_would_start_with_no_more_than_the_reserve_left_is_refused_unsent(
    app: Celery, service: Service, refusals: list[Decision]
) -> None:
    # the first read takes the whole call (its timeout, capped at 4.9 s): a read retry
    service.then(4.9, None).then(0, 200)
    session = service.session(Retry(read=2))
    with deadline_scope(budget=5, app=app), pytest.raises(DeadlineRefused) as refused:
        session.get("http://api.example/", timeout=60)
    assert len(service.sent) == 1
    assert refused.value.detail.startswith("GET api.example: 0.100 s left, not more than")
    assert len(refusals) == 1


@pytest.mark.parametrize(
    ("retry", "steps", "slept", "detail"),
    [
        pytest.param(
            Retry(total=3, status_forcelist=[503]),
            [(1, {"Retry-After": "2"}), (0, {"Retry-After": "2"}), (0, {})],
            [2.0],
            "GET api.example: 2.000 s left, less the client's retry pause of 2.000 s",
            id="retry-after",
        ),
        pytest.param(
            Retry(total=5, status_forcelist=[503], backoff_factor=1),  # 0, 2, 4 s
            [(0.5, {}), (0.5, {}), (0.5, {}), (0, {})],
            [2.0],
            "GET api.example: 1.500 s left, less the client's retry pause of 4.000 s",
            id="backoff",
        ),
    ],
)
def test_a_pause_urllib3_would_take_past_the_reserve_is_refused_before_it_is_slept(
    app: Celery,
    service: Service,
    refusals: list[Decision],
    retry: Retry,
    steps: list[tuple[float, dict[str, str]]],
    slept: list[float],
    detail: str,
) -> None:
    for takes, headers in steps:
        service.then(takes, 503, **headers)
    with deadline_scope(budget=5, app=app), pytest.raises(DeadlineRefused) as refused:
        service.session(retry).get("http://api.example/", timeout=60)
    assert service.pauses == slept  # the pauses that left time for the attempt after them
    assert len(service.sent) == len(steps) - 1  # the last step's attempt was never made
    assert refused.value.detail.startswith(detail)
    assert len(refusals) == 1


def test_a_retry_that_sleeps_its_own_way_is_judged_when_its_next_attempt_starts(
    app: Celery, service: Service, refusals: list[Decision]
) -> None:
    class Patient(Retry):
        def sleep(self, response: Any = None) -> None:
            time.sleep(4.95)  # a pause the adapter cannot know before it is over

    service.then(0, 503).then(0, 200)
    session = service.session(Patient(total=3, status_forcelist=[503]))
    with deadline_scope(budget=5, app=app), pytest.raises(DeadlineRefused) as refused:
        session.get("http://api.example/", timeout=60)
    assert service.pauses == [4.95]
    assert len(service.sent) == 1
    assert refused.value.detail.startswith("GET api.example: 0.050 s left, not more than")


def test_a_callers_total_timeout_shorter_than_the_time_left_is_kept(
    app: Celery, clock: FakeClock, session: tuple[requests.Session, RecordedDeadlineAdapter]
) -> None:
    client, adapter = session
    with deadline_scope(budget=5, app=app):
        total: Any = Timeout(total=2)
        client.get("http://api.example/", timeout=total)
    ((_, sent),) = adapter.handed
    assert sent.total == 2  # a deadline only shortens the caller's own


# -- gRPC ----------------------------------------------------------------------------------------


class Details(grpc.ClientCallDetails):
    def __init__(self, timeout: float | None, metadata: Any = None) -> None:
        self.method = "/shop.Inventory/Reserve"
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = None
        self.wait_for_ready = None
        self.compression = None


def intercepted(interceptor: DeadlineInterceptor, details: Details) -> grpc.ClientCallDetails:
    """The details each kind of call continues with (all four must agree)."""
    continued: list[grpc.ClientCallDetails] = []

    def continuation(given: grpc.ClientCallDetails, request: Any) -> Any:
        continued.append(given)
        return request

    interceptor.intercept_unary_unary(continuation, details, "r")
    interceptor.intercept_unary_stream(continuation, details, "r")
    interceptor.intercept_stream_unary(continuation, details, iter(["r"]))
    interceptor.intercept_stream_stream(continuation, details, iter(["r"]))
    first = continued[0]
    assert all(
        (c.timeout, c.metadata, c.method) == (first.timeout, first.metadata, first.method)
        for c in continued
    )
    return first


# the capped timeout (4.9 s, or the caller's 1.5 s) rounded down to gRPC's 10 ms unit,
# less its clocks' 2 ms: grpc-timeout, rounded up as gRPC writes it, never says more
@pytest.mark.parametrize(("own", "expected"), [(None, 4.898), (60.0, 4.898), (1.5, 1.498)])
def test_a_grpc_calls_timeout_is_capped_and_its_metadata_says_the_deadline(
    app: Celery, clock: FakeClock, own: float | None, expected: float
) -> None:
    forged = (("x-request-deadline", "forged"), ("X-Request-Timeout-Ms", "99999999"))
    given = Details(own, metadata=(*forged, ("x-tenant", "7")))
    with deadline_scope(budget=5, app=app):
        details = intercepted(DeadlineInterceptor(), given)
    assert details.timeout == pytest.approx(expected)
    assert details.method == "/shop.Inventory/Reserve"
    # gRPC sends the timeout as grpc-timeout itself, afresh at each of its own attempts:
    # the deadline goes as metadata as an instant only (metadata is sent again unchanged),
    # and the caller's deadline headers, whatever their syntax, are dropped
    assert details.metadata == (("x-tenant", "7"), ("x-request-deadline", DEADLINE))


def test_a_grpc_call_without_a_deadline_is_sent_as_written(app: Celery) -> None:
    given = Details(30.0)
    assert intercepted(DeadlineInterceptor(), given) is given


def test_a_grpc_call_that_cannot_finish_is_refused_before_any_byte_is_sent(
    app: Celery,
    clock: FakeClock,
    listener: tuple[str, Callable[[], bool]],
    refusals: list[Decision],
) -> None:
    address, reached = listener
    channel = grpc.intercept_channel(grpc.insecure_channel(address), DeadlineInterceptor())
    reserve: Any = channel.unary_unary("/shop.Inventory/Reserve")
    watch: Any = channel.unary_stream("/shop.Inventory/Watch")
    with deadline_scope(budget=5, app=app):
        clock.advance(4.95)
        with pytest.raises(DeadlineRefused) as refused:
            reserve(b"", timeout=30)
        future = reserve.future(b"")
        stream = watch(b"")
    with pytest.raises(DeadlineRefused):
        future.result()
    with pytest.raises(DeadlineRefused):
        next(iter(stream))
    channel.close()
    assert refused.value.detail.startswith("gRPC /shop.Inventory/Reserve: 0.050 s left")
    assert len(refusals) == 3  # one per call, each where it was refused
    assert not reached()


def _told_millis(millis: int) -> int:
    """What a gRPC server reads from the ``grpc-timeout`` gRPC writes for ``millis``, in
    milliseconds: grpc core's ``Timeout::FromMillis`` and its ``AsDuration``, line for
    line (each step rounds up; a value that lands on the next unit's is handed on)."""

    def up(value: int, divisor: int) -> int:
        return -(-value // divisor)

    def hours(h: int) -> int:
        return min(h, 27_000) * 3_600_000

    def minutes(m: int) -> int:
        if m < 1000:
            if m % 60:
                return m * 60_000
        elif m < 10_000:
            if (up(m, 10) * 10) % 60:
                return up(m, 10) * 600_000
        elif m < 100_000 and (up(m, 100) * 100) % 60:
            return up(m, 100) * 6_000_000
        return hours(up(m, 60))

    def seconds(s: int) -> int:
        if s < 1000:
            if s % 60:
                return s * 1000
        elif s < 10_000:
            if (up(s, 10) * 10) % 60:
                return up(s, 10) * 10_000
        elif s < 100_000 and (up(s, 100) * 100) % 60:
            return up(s, 100) * 100_000
        return minutes(up(s, 60))

    if millis <= 0:
        return 0
    if millis < 1000:
        return millis
    if millis < 10_000:
        if up(millis, 10) % 100:
            return up(millis, 10) * 10
    elif millis < 100_000 and up(millis, 100) % 10:
        return up(millis, 100) * 100
    return seconds(up(millis, 1000))


def test_the_timeout_grpc_writes_never_exceeds_the_capped_one() -> None:
    import math
    import random

    from celery_deadlines.contrib.grpc import sent_timeout

    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    edges = [0.0015, 0.5, 0.999, 1.0, 1.3999, 9.999, 10.0, 10.05, 99.99, 100.0, 999.9]
    edges += [1000.0, 9999.0, 1e5, 2e5, 6e5, 6.01e5, 1e7, 1e8]
    for capped in edges + [10 ** rng.uniform(-3, 8) for _ in range(20_000)]:
        sent = sent_timeout(capped)
        # gRPC's clocks, at worst: the deadline rounded up to a millisecond, the clock
        # read on sending a millisecond before it
        millis = math.ceil(sent * 1000) + 1
        # under 3 ms gRPC's clocks alone may add what is left: it is told 2 ms at most
        assert _told_millis(millis) <= max(capped * 1000, 2), (seed, capped, sent)
        assert 0 < sent <= capped
