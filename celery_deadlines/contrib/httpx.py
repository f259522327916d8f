"""httpx calls under the current deadline: event hooks for ``httpx.Client`` and for
``httpx.AsyncClient`` (``pip install 'celery-deadlines[httpx]'``).

::

    client = httpx.Client(event_hooks=deadline_hooks())
    client = httpx.AsyncClient(event_hooks=async_deadline_hooks())

Every request the client sends passes the outbound gate
(:func:`celery_deadlines.core.outbound.prepare`) first: each redirect and each request of an
auth flow, whatever transport, mount or proxy sends it (hooks, not a transport: httpx
sends through a proxy's own transport, read from the environment, past a transport the
client was given). Without a deadline the request is sent as written. With one, it is
refused before a connection is opened (:class:`DeadlineRefused`, gate ``outbound``), or
sent with the deadline's headers (replacing any of the same name) and its timeouts
capped.

httpx's timeout is per phase (``pool``, ``connect``, ``write``, ``read``), and httpcore
reads a phase's timeout when the phase starts: the wait for a connection, the
connection, the request's writes, the answer's headers, its body. Each phase gets the
caller's own timeout, at most what is left of the call then. Between the chunks of the
answer's body, a call whose time is up ends: a service that trickles its answer is cut
too. Every cut is the client's own timeout error (``httpx.PoolTimeout``,
``ConnectTimeout``, ``WriteTimeout``, ``ReadTimeout``). What is not cut at the instant
the call's time is up: an answer that stops arriving in the middle of its body waits out
the body's read timeout, which was what was left of the call when the body began.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any, Final

import httpx
from httpcore._sync.connection import RETRIES_BACKOFF_FACTOR, exponential_backoff

from ..core.outbound import OutboundCall, prepare
from ..rules.budgets import DurationLike, parse_duration

__all__ = ["async_deadline_hooks", "deadline_hooks"]

#: The phases of httpx's timeout, as httpcore reads them from the request.
PHASES: Final = ("connect", "read", "write", "pool")
_UP: Final = timedelta(0)


class _CappedTimeouts(dict[str, float | None]):
    """The request's ``timeout`` extension, each phase read as the caller's own timeout
    capped at what is left of the call at that moment. Its items, for anything that
    copies it, are the caps as of the call's admission."""

    def __init__(self, own: Mapping[str, Any], call: OutboundCall) -> None:
        self.own = {phase: own.get(phase) for phase in PHASES}
        self.call = call
        super().__init__({**own, **{phase: call.cap(self.own[phase]) for phase in PHASES}})

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.own:
            return self.call.cap(self.own[key])
        return super().get(key, default)

    def __getitem__(self, key: str) -> float | None:
        if key in self.own:
            return self.call.cap(self.own[key])
        return super().__getitem__(key)


def target_of(request: httpx.Request) -> str:
    """The call's method and host (no path, no query: a log line and a metrics label)."""
    port = request.url.port
    return f"{request.method} {request.url.host}" + (f":{port}" if port else "")


def _time_up(request: httpx.Request) -> httpx.ReadTimeout:
    return httpx.ReadTimeout("the call's time ran out while its answer arrived", request=request)


class _BoundedStream(httpx.SyncByteStream):
    """An answer's body that ends the call when its time is up, between chunks."""

    def __init__(self, inner: httpx.SyncByteStream, call: OutboundCall, request: httpx.Request):
        self.inner, self.call, self.request = inner, call, request

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            if self.call.left() <= _UP:
                raise _time_up(self.request)
            yield chunk

    def close(self) -> None:
        self.inner.close()


class _AsyncBoundedStream(httpx.AsyncByteStream):
    """The same, for ``httpx.AsyncClient``."""

    def __init__(self, inner: httpx.AsyncByteStream, call: OutboundCall, request: httpx.Request):
        self.inner, self.call, self.request = inner, call, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            if self.call.left() <= _UP:
                raise _time_up(self.request)
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


def _connect_pause(retry: int) -> float:
    """The pause before httpcore's connect retry ``retry`` (0: the first), by httpcore's
    own schedule (its ``HTTPConnection`` sleeps it; its trace does not say it)."""
    return next(itertools.islice(exponential_backoff(RETRIES_BACKOFF_FACTOR), retry, None))


class _Attempts:
    """One request's steps in httpcore, as its ``trace`` extension reports them before
    each one: every connection attempt (a retry passes the gate first, and its pause
    before it) and every TLS handshake gets what is left of the call's connect timeout
    then, and the request's headers are those of the instant it is sent. A trace the
    caller gave (``inner``) is still called, after."""

    def __init__(self, timeouts: _CappedTimeouts, inner: Any) -> None:
        self.timeouts = timeouts
        self.inner = inner
        self.retries = 0  # httpcore's connect retries so far, for this connection
        self.retried = False  # the next connection attempt is a retry

    def step(self, name: str, info: dict[str, Any]) -> None:
        call = self.timeouts.call
        step = name.partition(".")[2]
        if step in _CONNECTS:
            if self.retried:
                call.again()  # refused when no more than the reserve is left
            else:
                self.retries = 0
            self.retried = False
            info["timeout"] = self.timeouts.get("connect")  # what httpcore connects with
        elif step == "start_tls.started":
            info["timeout"] = self.timeouts.get("connect")
        elif name == "connection.retry.started":
            call.again(pause=_connect_pause(self.retries))  # before httpcore sleeps it
            self.retries += 1
        elif name == "connection.retry.complete":
            self.retried = True
        elif step == "send_request_headers.started":
            ours = {
                name.lower().encode(): value.encode()
                for name, value in call.again().headers.items()
            }
            request = info["request"]
            kept = [(key, value) for key, value in request.headers if key.lower() not in ours]
            request.headers = [*kept, *ours.items()]

    def __call__(self, name: str, info: dict[str, Any]) -> None:
        self.step(name, info)
        if self.inner is not None:
            self.inner(name, info)


class _AsyncAttempts(_Attempts):
    """The same, for ``httpx.AsyncClient`` (httpcore awaits its trace)."""

    async def __call__(self, name: str, info: dict[str, Any]) -> None:  # type: ignore[override]
        self.step(name, info)
        if self.inner is not None:
            await self.inner(name, info)


#: httpcore's connection attempts (to the service, or to a proxy)
_CONNECTS: Final = frozenset({"connect_tcp.started", "connect_unix_socket.started"})


class _Gate:
    """The hooks' state: the reserve and the app whose settings apply."""

    def __init__(self, reserve: DurationLike | None, app: Any) -> None:
        # checked here: a bad reserve fails where the client is made, not at a call
        self.reserve = (
            None if reserve is None else parse_duration(reserve, name="reserve", allow_zero=True)
        )
        self.app = app

    def admit(self, request: httpx.Request, attempts: type[_Attempts]) -> None:
        """Pass ``request`` through the outbound gate (raises :class:`DeadlineRefused`)."""
        call = prepare(target_of(request), reserve=self.reserve, app=self.app)
        if call is None:
            return
        for name, value in call.headers.items():
            request.headers[name] = value  # our deadline, never a caller's
        own = request.extensions.get("timeout") or {}
        timeouts = request.extensions["timeout"] = _CappedTimeouts(own, call)
        inner = request.extensions.get("trace")
        if isinstance(inner, _Attempts):  # a redirect's request shares the extensions
            inner = inner.inner
        request.extensions["trace"] = attempts(timeouts, inner)

    def request(self, request: httpx.Request) -> None:
        self.admit(request, _Attempts)

    @staticmethod
    def call_of(response: httpx.Response) -> OutboundCall | None:
        timeouts = response.request.extensions.get("timeout")
        return timeouts.call if isinstance(timeouts, _CappedTimeouts) else None

    def response(self, response: httpx.Response) -> None:
        """Bound the answer's body by the call's time (its headers have arrived)."""
        call = self.call_of(response)
        if call is not None and isinstance(response.stream, httpx.SyncByteStream):
            response.stream = _BoundedStream(response.stream, call, response.request)

    async def arequest(self, request: httpx.Request) -> None:
        self.admit(request, _AsyncAttempts)

    async def aresponse(self, response: httpx.Response) -> None:
        call = self.call_of(response)
        if call is not None and isinstance(response.stream, httpx.AsyncByteStream):
            response.stream = _AsyncBoundedStream(response.stream, call, response.request)


def deadline_hooks(
    *, reserve: DurationLike | None = None, app: Any = None
) -> dict[str, list[Callable[[Any], Any]]]:
    """``event_hooks`` for ``httpx.Client``: the outbound gate, the deadline's headers and
    the capped timeouts (see the module's docstring). ``reserve``: what each call leaves
    its caller (default ``deadlines_outbound_reserve``); ``app``: the Celery app whose
    settings apply (default: the running task's, or the current one). To keep hooks of
    your own, add them to these lists."""
    gate = _Gate(reserve, app)
    return {"request": [gate.request], "response": [gate.response]}


def async_deadline_hooks(
    *, reserve: DurationLike | None = None, app: Any = None
) -> dict[str, list[Callable[[Any], Awaitable[None]]]]:
    """The same, for ``httpx.AsyncClient`` (whose hooks are awaited)."""
    gate = _Gate(reserve, app)
    return {"request": [gate.arequest], "response": [gate.aresponse]}
