"""requests calls under the current deadline: a transport adapter for a ``Session``
(``pip install 'celery-deadlines[requests]'``).

::

    session = requests.Session()
    session.mount("http://", DeadlineAdapter())
    session.mount("https://", DeadlineAdapter())

Every request the session sends through the adapter (each redirect too) passes the
outbound gate (:func:`celery_deadlines.outbound.prepare`) first. Without a deadline it is
sent as written. With one, it is refused before a connection is opened
(:class:`DeadlineRefused`, gate ``outbound``), or sent with the deadline's headers
(replacing any of the same name) and its timeout capped: the connect and the read
timeouts are each the caller's own (``timeout=`` as seconds, a ``(connect, read)`` tuple
or a urllib3 ``Timeout``), at most the time left of the call when it is sent, and
urllib3's ``total`` is that time, so the read gets what the connection left of it.

urllib3 applies the read timeout to each read of the socket, not to the whole answer:
a service that trickles its answer, or a body read later (``stream=True``), can outlast
the deadline by up to one read timeout. Use the httpx hook where that matters; the
task's hard time limit at the deadline is the backstop.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from requests import PreparedRequest, Response
from requests.adapters import HTTPAdapter
from urllib3.util import Timeout

from .outbound import OutboundCall, prepare
from .rules.budgets import DurationLike, parse_duration

__all__ = ["DeadlineAdapter"]


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
    """The timeout a call admitted as ``call`` is sent with."""
    connect, read = own_timeouts(timeout)
    return Timeout(connect=call.cap(connect), read=call.cap(read), total=call.cap(None))


def target_of(request: PreparedRequest) -> str:
    """The call's method and host (no user, path or query: a log line, a metrics label)."""
    host = urlsplit(request.url or "").netloc.rpartition("@")[2]
    return f"{request.method} {host}"


class DeadlineAdapter(HTTPAdapter):
    """requests' ``HTTPAdapter`` with the outbound gate, the deadline's headers and the
    capped timeout (see the module's docstring). ``reserve``: what a call leaves its
    caller (default ``deadlines_outbound_reserve``); ``app``: the Celery app whose
    settings apply (default: the running task's, or the current one); the rest is
    ``HTTPAdapter``'s."""

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
        if call is not None:
            request.headers.update(call.headers)  # our deadline, never a caller's
            timeout = capped(timeout, call)
        return super().send(
            request, stream=stream, timeout=timeout, verify=verify, cert=cert, proxies=proxies
        )
