"""requests calls under the current deadline: a transport adapter for a ``Session``
(``pip install 'celery-deadlines[requests]'``).

::

    session = requests.Session()
    session.mount("http://", DeadlineAdapter())
    session.mount("https://", DeadlineAdapter(max_retries=Retry(total=3, backoff_factor=0.2)))

Every request the session sends through the adapter (each redirect too) passes the
outbound gate (:func:`celery_deadlines.core.outbound.prepare`) first. Without a deadline it is
sent as written. With one, it is refused before a connection is opened
(:class:`DeadlineRefused`, gate ``outbound``), or sent with the deadline's headers
(replacing any of the same name) and its timeout capped: the connect and the read
timeouts are each the caller's own (``timeout=`` as seconds, a ``(connect, read)`` tuple
or a urllib3 ``Timeout``, whose ``total`` is kept too), at most the time left of the call
when it is sent, and urllib3's ``total`` is at most that time, so the read gets what the
connection left of it.

**urllib3's retries** (``max_retries``: connect, read and status retries,
``status_forcelist``, ``Retry-After``, the backoff) are attempts of the same call, and
each is held to its deadline: the adapter's connection pools pass every attempt urllib3
makes through the gate when it starts (:meth:`~celery_deadlines.core.outbound.OutboundCall.again`),
so an attempt with no more than the reserve left is refused (``DeadlineRefused``, as
the first would be), and each carries the headers of its own instant and connect and
read timeouts capped by what is left then. A pause before a retry (urllib3's backoff, or
the ``Retry-After`` the service answered) that would leave no more than the reserve is
refused before it is slept. The pause judged is the one urllib3's ``Retry`` works out
(``get_retry_after``, ``get_backoff_time``, a subclass's own included); a ``Retry``
subclass that overrides ``sleep`` itself sleeps as it says, and only its next attempt is
judged (its pause is not known before it is over).

For a call with a deadline, the adapter and the connection pool it hands the call to
are seen as classes that do this (their own state, shared, and one method more each); a
call without a deadline runs requests' and urllib3's own code, nothing added.

urllib3 applies the read timeout to each read of the socket, not to the whole answer:
a service that trickles its answer, or a body read later (``stream=True``), can outlast
the deadline by up to one read timeout. Use the httpx hook where that matters; the
task's hard time limit at the deadline is the backstop.
"""

from __future__ import annotations

import copy
import time
from contextvars import ContextVar
from typing import Any, TypeVar
from urllib.parse import urlsplit

from requests import PreparedRequest, Response
from requests.adapters import HTTPAdapter
from urllib3 import HTTPConnectionPool, HTTPHeaderDict
from urllib3.response import BaseHTTPResponse
from urllib3.util import Retry, Timeout
from urllib3.util.timeout import _DEFAULT_TIMEOUT

from ..core.outbound import OutboundCall, prepare
from ..rules.budgets import DurationLike, parse_duration

__all__ = ["DeadlineAdapter"]

V = TypeVar("V")


def _seconds(value: object) -> float | None:
    """A timeout urllib3 may hold (a number, ``None`` or its default's sentinel) as seconds
    or ``None`` (none of the caller's own)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def own_timeouts(timeout: Any) -> tuple[float | None, float | None]:
    """The caller's connect and read timeouts, however requests was given them."""
    if isinstance(timeout, Timeout):
        probe = timeout.clone()  # its read timeout is known once a connection starts
        probe.start_connect()
        return _seconds(timeout.connect_timeout), _seconds(probe.read_timeout)
    if isinstance(timeout, tuple):
        connect, read = timeout
        return _seconds(connect), _seconds(read)
    return _seconds(timeout), _seconds(timeout)


def capped(timeout: Any, call: OutboundCall) -> Timeout:
    """The timeout an attempt of ``call`` starting now is sent with."""
    connect, read = own_timeouts(timeout)
    total = _seconds(timeout.total) if isinstance(timeout, Timeout) else None
    return Timeout(connect=call.cap(connect), read=call.cap(read), total=call.cap(total))


def target_of(request: PreparedRequest) -> str:
    """The call's method and host (no user, path or query: a log line, a metrics label)."""
    host = urlsplit(request.url or "").netloc.rpartition("@")[2]
    return f"{request.method} {host}"


class _Attempts:
    """The call a :class:`DeadlineAdapter` is sending, for each attempt urllib3 makes of it
    (its connection pool's ``urlopen`` again, for a retry)."""

    __slots__ = ("call", "first")

    def __init__(self, call: OutboundCall) -> None:
        self.call = call
        self.first = True

    def next(self) -> OutboundCall | None:
        """The gate for the attempt starting now: ``None`` for the first (sent as the
        adapter admitted it), else the attempt as of now (raises :class:`DeadlineRefused`)."""
        if self.first:
            self.first = False
            return None
        self.call = self.call.again()
        return self.call


#: The call the adapter is sending in this thread (or task): set only for a call with a
#: deadline, for as long as ``HTTPAdapter.send`` runs.
_SENDING: ContextVar[_Attempts | None] = ContextVar("celery_deadlines_requests_call", default=None)


def _pause(seconds: float) -> None:
    """urllib3's pause before a retry, refused first if the retry could not start in time."""
    if seconds <= 0:
        return
    attempts = _SENDING.get()
    if attempts is not None:
        attempts.call.again(pause=seconds)
    time.sleep(seconds)


class _PacedRetry(Retry):
    """urllib3's ``Retry`` whose pauses pass the outbound gate before they are slept: the
    same choice as ``Retry.sleep`` (the ``Retry-After`` the service answered, else the
    backoff), the same values, each slept once judged."""

    def sleep(self, response: BaseHTTPResponse | None = None) -> None:
        if self.respect_retry_after_header and response and self.sleep_for_retry(response):
            return
        _pause(self.get_backoff_time())

    def sleep_for_retry(self, response: BaseHTTPResponse) -> bool:
        retry_after = self.get_retry_after(response)
        if not retry_after:
            return False
        _pause(retry_after)
        return True


#: each class met, with a mixin's ways first (made once: a user's own subclass keeps its own)
_KINDS: dict[tuple[type, type], type] = {}


def _with(mixin: type, kind: type[V]) -> type[V]:
    """``kind`` with ``mixin``'s ways first: ``mixin`` itself for the class it extends."""
    if issubclass(kind, mixin):
        return kind
    if kind in mixin.__bases__:
        return mixin
    made = _KINDS.get((mixin, kind))
    if made is None:
        made = _KINDS.setdefault((mixin, kind), type(f"Deadline{kind.__name__}", (mixin, kind), {}))
    return made


def _paced(retries: Retry) -> Retry:
    """``retries`` with its pauses judged (a copy: the adapter's own is shared), unless its
    class sleeps its own way."""
    kind = type(retries)
    if issubclass(kind, _PacedRetry) or kind.sleep is not Retry.sleep:
        return retries
    if kind.sleep_for_retry is not Retry.sleep_for_retry:
        return retries
    paced = copy.copy(retries)
    paced.__class__ = _with(_PacedRetry, kind)
    return paced


def _seen_as(obj: Any, kind: type[V]) -> V:
    """``obj`` seen as a ``kind`` (a subclass of its class) for one call with a deadline:
    the same state (its very ``__dict__``), ``kind``'s behaviour. Only such a call meets
    one: a call without a deadline runs requests' and urllib3's own code, nothing added."""
    seen = object.__new__(kind)
    object.__setattr__(seen, "__dict__", obj.__dict__)
    return seen


class _EachAttempt(HTTPConnectionPool):
    """A connection pool (seen as one for a call with a deadline) whose every attempt
    passes the gate, with the headers and the timeouts of its own instant: urllib3 calls
    ``urlopen`` again on the same pool for each retry, after its pause."""

    def urlopen(  # type: ignore[override]  # urllib3's own signature, as it declares it
        self,
        method: str,
        url: str,
        body: Any = None,
        headers: Any = None,
        retries: Retry | bool | int | None = None,
        redirect: bool = True,
        assert_same_host: bool = True,
        timeout: Any = _DEFAULT_TIMEOUT,
        pool_timeout: int | None = None,
        release_conn: bool | None = None,
        chunked: bool = False,
        body_pos: Any = None,
        preload_content: bool = True,
        decode_content: bool = True,
        **response_kw: Any,
    ) -> BaseHTTPResponse:
        attempts = _SENDING.get()
        if attempts is not None:
            call = attempts.next()
            if call is not None:
                headers = HTTPHeaderDict(self.headers if headers is None else headers)
                for name, value in call.headers.items():
                    headers[name] = value  # this attempt's deadline, never an earlier one's
                timeout = capped(timeout, call)
            if not isinstance(retries, Retry):
                retries = Retry.from_int(retries, redirect=redirect, default=self.retries)
            retries = _paced(retries)
        return super().urlopen(
            method,
            url,
            body,
            headers,
            retries,
            redirect,
            assert_same_host,
            timeout=timeout,
            pool_timeout=pool_timeout,
            release_conn=release_conn,
            chunked=chunked,
            body_pos=body_pos,
            preload_content=preload_content,
            decode_content=decode_content,
            **response_kw,
        )


class DeadlineAdapter(HTTPAdapter):
    """requests' ``HTTPAdapter`` with the outbound gate, the deadline's headers and the
    capped timeout, for each attempt urllib3 makes (see the module's docstring).
    ``reserve``: what a call leaves its caller (default ``deadlines_outbound_reserve``);
    ``app``: the Celery app whose settings apply (default: the running task's, or the
    current one); the rest is ``HTTPAdapter``'s (``max_retries``: urllib3's ``Retry``)."""

    #: what a pickled adapter keeps (HTTPAdapter's ``__getstate__`` reads this list)
    __attrs__ = [*HTTPAdapter.__attrs__, "reserve", "app"]

    def __init__(
        self, *args: Any, reserve: DurationLike | None = None, app: Any = None, **kwargs: Any
    ) -> None:
        # checked here: a bad reserve fails where the session is made, not at a call
        self.reserve = (
            None if reserve is None else parse_duration(reserve, name="reserve", allow_zero=True)
        )
        self.app = app
        super().__init__(*args, **kwargs)

    def send(
        self,
        request: PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: dict[str, str] | None = None,
    ) -> Response:
        call = prepare(target_of(request), reserve=self.reserve, app=self.app)
        if call is None:
            return super().send(
                request, stream=stream, timeout=timeout, verify=verify, cert=cert, proxies=proxies
            )
        request.headers.update(call.headers)  # our deadline, never a caller's
        first: Any = capped(timeout, call)
        sender = _seen_as(self, _with(_Sending, type(self)))
        sending = _SENDING.set(_Attempts(call))
        try:
            return super(DeadlineAdapter, sender).send(
                request, stream=stream, timeout=first, verify=verify, cert=cert, proxies=proxies
            )
        finally:
            _SENDING.reset(sending)


class _Sending(DeadlineAdapter):
    """The adapter (seen as one) sending a call with a deadline: the connection pool it
    hands the call to is seen as :class:`_EachAttempt`."""

    def get_connection_with_tls_context(
        self,
        request: PreparedRequest,
        verify: Any,
        proxies: dict[str, str] | None = None,
        cert: Any = None,
    ) -> HTTPConnectionPool:
        pool = super().get_connection_with_tls_context(request, verify, proxies=proxies, cert=cert)
        return _seen_as(pool, _with(_EachAttempt, type(pool)))
