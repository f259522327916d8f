"""gRPC calls under the current deadline: a client interceptor for grpcio
(``pip install 'celery-deadlines[grpc]'``).

::

    channel = grpc.intercept_channel(grpc.insecure_channel(address), DeadlineInterceptor())
    stub = InventoryStub(channel)

Every call on the channel (unary or streaming, either way; ``with_call`` and ``future``
too) passes the outbound gate (:func:`celery_deadlines.outbound.prepare`) first. Without a
deadline it is sent as written. With one, it is refused before anything is sent
(:class:`DeadlineRefused`, gate ``outbound``: raised by the call, by ``result()`` of a
future, or by the first ``next()`` of a stream), or sent with its timeout capped: the
caller's own ``timeout=``, at most the time left minus the reserve. gRPC sends that
timeout as ``grpc-timeout``, and ends the call with ``DEADLINE_EXCEEDED`` when it is up.
The other headers of ``deadlines_outbound_headers`` (an RFC 3339 instant...) go as
metadata, so a server can read the deadline itself (``grpc-`` names are gRPC's own).
``grpc.aio`` channels are not covered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from .outbound import prepare
from .rules.budgets import DurationLike, parse_duration

__all__ = ["DeadlineInterceptor"]

Request = TypeVar("Request")
Outcome = TypeVar("Outcome")


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
        ours = {name: value for name, value in call.headers.items() if not name.startswith("grpc-")}
        # our deadline, never a caller's: a caller's entry of the same name is dropped
        kept = [(key, value) for key, value in details.metadata or () if key.lower() not in ours]
        return _CallDetails(details, call.cap(details.timeout), [*kept, *ours.items()])

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
