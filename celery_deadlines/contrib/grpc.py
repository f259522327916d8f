"""gRPC calls under the current deadline: a client interceptor for grpcio
(``pip install 'celery-deadlines[grpc]'``).

::

    channel = grpc.intercept_channel(grpc.insecure_channel(address), DeadlineInterceptor())
    stub = InventoryStub(channel)

Every call on the channel (unary or streaming, either way; ``with_call`` and ``future``
too) passes the outbound gate (:func:`celery_deadlines.core.outbound.prepare`) first. Without a
deadline it is sent as written. With one, it is refused before anything is sent
(:class:`DeadlineRefused`, gate ``outbound``: raised by the call, by ``result()`` of a
future, or by the first ``next()`` of a stream), or sent with its timeout capped: the
caller's own ``timeout=``, at most the time left minus the reserve. gRPC sends that
timeout as ``grpc-timeout``, and ends the call with ``DEADLINE_EXCEEDED`` when it is up;
gRPC writes it rounded up to its unit, so the timeout given is rounded down first
(:func:`sent_timeout`): the server is never told more than the capped time.
The headers of ``deadlines_outbound_headers`` that say the deadline as an instant
(``rfc3339``) go as metadata, so a server can read the deadline itself (``grpc-`` names
are gRPC's own); those that say the time left (``milliseconds``, ``grpc-timeout``) do
not: gRPC's own retries (a service config's ``retryPolicy``; its hedging and
transparent retries) send a call's metadata again as it was, while ``grpc-timeout`` is
written afresh for each attempt from the call's deadline. That deadline holds every
attempt (gRFC A6): gRPC starts none after it (the deadline less the reserve), whatever
its backoff or a server's pushback, and ends the call ``DEADLINE_EXCEEDED`` there.
``grpc.aio`` channels are not covered.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar

import grpc

from ..core.outbound import prepare
from ..rules.budgets import DurationLike, parse_duration

__all__ = ["DeadlineInterceptor"]

Request = TypeVar("Request")
Outcome = TypeVar("Outcome")


#: The unit gRPC writes a ``grpc-timeout`` in, rounding up, for a timeout under each
#: bound (seconds; grpc core's ``Timeout::FromMillis``: five digits at most). A value
#: that lands on a whole minute is written in minutes, tens of minutes or hours, each
#: rounded up again: from 1,000 minutes on, the units here are ones those keep exact
#: (tens of minutes, hours, then 300 minutes, a multiple of both 60 and 100).
_GRPC_UNITS: Final = (
    (1.0, 0.001),
    (10.0, 0.01),
    (100.0, 0.1),
    (1e3, 1.0),
    (1e4, 10.0),
    (6e4, 100.0),
    (1e5, 600.0),
    (6e5, 3600.0),
)
_GRPC_LONGEST_UNIT: Final = 18_000.0
#: What gRPC's clocks add when it works out the timeout to send: in whole milliseconds,
#: the call's deadline rounded up and the clock read when the call is sent.
_GRPC_CLOCK_SLACK: Final = 0.002
#: The shortest timeout handed to gRPC (0 reads as none).
_SHORTEST: Final = 1e-6


def sent_timeout(capped: float) -> float:
    """A timeout (seconds) for gRPC whose ``grpc-timeout``, as gRPC rounds it up to its
    unit, is at most ``capped`` (under 3 ms, at most the 2 ms gRPC's clocks may add):
    ``capped`` rounded down to that unit, less the clocks' slack. A call so given ends
    at most one unit sooner (10 ms for a timeout of 1 to 10 s, 100 ms up to 100 s)."""
    unit = next((unit for bound, unit in _GRPC_UNITS if capped < bound), _GRPC_LONGEST_UNIT)
    return max(math.floor(capped / unit) * unit - _GRPC_CLOCK_SLACK, _SHORTEST)


class _CallDetails(grpc.ClientCallDetails):
    """A call's details with its capped timeout and the deadline's metadata."""

    def __init__(
        self, details: grpc.ClientCallDetails, timeout: float, metadata: list[tuple[str, Any]]
    ) -> None:
        self.method = details.method
        self.timeout = timeout
        self.metadata = tuple(metadata)
        self.credentials = details.credentials
        self.wait_for_ready = details.wait_for_ready
        self.compression = details.compression


class DeadlineInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """The outbound gate for every call of a channel (see the module's docstring).
    ``reserve``: what a call leaves its caller (default ``deadlines_outbound_reserve``);
    ``app``: the Celery app whose settings apply (default: the running task's, or the
    current one)."""

    def __init__(self, *, reserve: DurationLike | None = None, app: Any = None) -> None:
        # checked here: a bad reserve fails where the channel is made, not at a call
        self.reserve = (
            None if reserve is None else parse_duration(reserve, name="reserve", allow_zero=True)
        )
        self.app = app

    def details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        """The details a call is sent with (raises :class:`DeadlineRefused`)."""
        method = details.method
        target = method if isinstance(method, str) else bytes(method).decode()
        call = prepare(f"gRPC {target}", reserve=self.reserve, app=self.app)
        if call is None:
            return details
        # our deadline, never a caller's: a caller's entry of any of its names is dropped
        kept = [
            (key, value) for key, value in details.metadata or () if key.lower() not in call.headers
        ]
        # only an instant: gRPC sends metadata again as it was on each of its own retries
        ours = {
            name: value
            for name, value in call.headers.items()
            if call.names[name] == "rfc3339" and not name.startswith("grpc-")
        }
        timeout = sent_timeout(call.cap(details.timeout))
        return _CallDetails(details, timeout, [*kept, *ours.items()])

    def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Request], Outcome],
        client_call_details: grpc.ClientCallDetails,
        request: Request,
    ) -> Outcome:
        return continuation(self.details(client_call_details), request)

    def intercept_unary_stream(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Request], Outcome],
        client_call_details: grpc.ClientCallDetails,
        request: Request,
    ) -> Outcome:
        return continuation(self.details(client_call_details), request)

    def intercept_stream_unary(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Iterator[Request]], Outcome],
        client_call_details: grpc.ClientCallDetails,
        request_iterator: Iterator[Request],
    ) -> Outcome:
        return continuation(self.details(client_call_details), request_iterator)

    def intercept_stream_stream(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Iterator[Request]], Outcome],
        client_call_details: grpc.ClientCallDetails,
        request_iterator: Iterator[Request],
    ) -> Outcome:
        return continuation(self.details(client_call_details), request_iterator)
