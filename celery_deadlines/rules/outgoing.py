"""Pure rules for a call to another service under the current deadline (no clock, no I/O).

The sending side of :mod:`celery_deadlines.rules.incoming`:

* **the headers** that carry the deadline, in the syntaxes the receiving side reads
  (``grpc-timeout``, ``milliseconds``, ``rfc3339``). They carry the deadline itself:
  work the service does, or publishes, is bound by the one deadline of the whole
  workflow, not by how long this caller waits for the answer. A relative value is
  rounded down, so no header ever names a later instant than the deadline;
* **the outbound gate** (:func:`admit`): a call may start only with more than its
  ``reserve`` left. The reserve is the caller's own: the time it keeps, after the call
  gives up, to handle the outcome before its deadline. With no more than that left,
  the call could not wait for any answer. Each attempt a client makes passes it: a
  retry when it starts, and before the pause that precedes it;
* **the call's timeout** (:func:`cap`): the caller's own timeout, at most the time left
  minus the reserve; a timeout the caller wrote can only shorten it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Final

from .budgets import capped_seconds
from .gates import Decision, Gate, Reason, seconds
from .incoming import Syntax
from .quoting import shown

ZERO: Final = timedelta(0)
#: The least timeout a call is given (a client reads 0 as "do not wait" or "no
#: timeout"): what a call whose time is up waits before its client's timeout error.
LEAST: Final = timedelta(microseconds=1)

#: The headers sent by default, in lower case (HTTP/2 and gRPC metadata need it): the
#: names the receiving side's how-to honours (``deadlines_request_headers``), so two
#: services that both use this library share one deadline once the receiver trusts
#: the caller.
DEFAULT_HEADERS: Final[Mapping[str, Syntax]] = MappingProxyType(
    {
        "grpc-timeout": "grpc-timeout",
        "x-request-timeout-ms": "milliseconds",
        "x-request-deadline": "rfc3339",
    }
)

#: grpc-timeout's units, finest first, as whole multiples of a timedelta (``n``,
#: nanoseconds, is finer than a timedelta can hold).
_GRPC_UNITS: Final = (
    ("u", timedelta(microseconds=1)),
    ("m", timedelta(milliseconds=1)),
    ("S", timedelta(seconds=1)),
    ("M", timedelta(minutes=1)),
    ("H", timedelta(hours=1)),
)
_GRPC_DIGITS: Final = 99_999_999


# -- the three syntaxes --------------------------------------------------------------------------


def format_grpc_timeout(span: timedelta) -> str:
    """``span`` as a ``grpc-timeout`` value: at most 8 digits, in the finest unit that
    holds it, rounded down (``0m`` once no time is left)."""
    left = max(span, ZERO)
    for unit, size in _GRPC_UNITS:
        count = left // size
        if count <= _GRPC_DIGITS:
            return f"{count}{unit}"
    return f"{_GRPC_DIGITS}H"  # 11,000 years: beyond any deadline


def format_milliseconds(span: timedelta) -> str:
    """``span`` in whole milliseconds, rounded down (``0`` once no time is left)."""
    return str(max(span, ZERO) // timedelta(milliseconds=1))


def format_rfc3339(instant: datetime) -> str:
    """An aware instant as RFC 3339 in UTC, to the microsecond (``...T10:00:00.250000Z``)."""
    if instant.tzinfo is None:
        raise ValueError("an instant on the wire must be aware")
    utc = instant.astimezone(UTC).replace(tzinfo=None)
    return utc.isoformat(timespec="microseconds") + "Z"


def header_value(syntax: Syntax, *, deadline: datetime, now: datetime) -> str:
    """The value of a header of ``syntax`` that says ``deadline``, read at ``now``."""
    if syntax == "rfc3339":
        return format_rfc3339(deadline)
    if syntax == "grpc-timeout":
        return format_grpc_timeout(deadline - now)
    return format_milliseconds(deadline - now)


def headers(names: Mapping[str, Syntax], *, deadline: datetime, now: datetime) -> dict[str, str]:
    """``{header name: value}`` saying ``deadline`` at ``now``, one per entry of ``names``."""
    return {
        name: header_value(syntax, deadline=deadline, now=now) for name, syntax in names.items()
    }


# -- the outbound gate ---------------------------------------------------------------------------


def admit(
    *,
    deadline: datetime,
    now: datetime,
    reserve: timedelta,
    target: str,
    pause: timedelta = ZERO,
) -> Decision:
    """May a call to ``target`` (its method and host, for the explanation) start at ``now``,
    or, for a client's retry, once its ``pause`` (its backoff, or a ``Retry-After``) is over?

    Refused with ``deadline_passed`` when no time is left, and with
    ``insufficient_budget`` when no more than ``reserve`` is, or would be after the pause
    (``remaining == reserve`` is refused too: the call's timeout would be zero). A retry
    refused for its pause is refused before it, not once it is over."""
    remaining = deadline - now
    if remaining <= ZERO:
        return Decision(
            gate=Gate.OUTBOUND,
            reason=Reason.DEADLINE_PASSED,
            deadline=deadline,
            clock_reading=now,
            remaining=remaining,
            detail=f"{target}: deadline passed {seconds(-remaining)} ago; not sent",
        )
    if remaining - pause <= reserve:
        waits = f", less the client's retry pause of {seconds(pause)}" if pause else ""
        return Decision(
            gate=Gate.OUTBOUND,
            reason=Reason.INSUFFICIENT_BUDGET,
            deadline=deadline,
            clock_reading=now,
            remaining=remaining,
            detail=(
                f"{target}: {seconds(remaining)} left{waits}, not more than the outbound "
                f"reserve of {seconds(reserve)}; not sent"
            ),
        )
    return Decision(Gate.OUTBOUND, None, deadline, now, remaining)


def unreadable(*, now: datetime, target: str, value: object) -> Decision:
    """The refusal of a call whose governing deadline cannot be read (a running task's
    header): no header could say it, and no timeout could honour it."""
    return Decision(
        gate=Gate.OUTBOUND,
        reason=Reason.INVALID_DEADLINE,
        deadline=None,
        clock_reading=now,
        remaining=None,
        detail=f"{target}: the current deadline cannot be read ({shown(value, 40)}); not sent",
    )


@dataclass(frozen=True, slots=True)
class Call:
    """A call the gate let start at ``now``: it carries ``headers`` (saying ``deadline``)
    and may take ``timeout``, until the deadline less the reserve."""

    deadline: datetime
    timeout: timedelta
    headers: Mapping[str, str]


def call_for(
    *, deadline: datetime, now: datetime, reserve: timedelta, names: Mapping[str, Syntax]
) -> Call:
    """The call :func:`admit` allowed at ``now`` (it assumes it did)."""
    timeout = deadline - reserve - now
    return Call(deadline, timeout, headers(names, deadline=deadline, now=now))


def cap(own: float | None, left: timedelta) -> timedelta:
    """A timeout for one phase of a call: the caller's own (seconds, as its client takes
    them; ``None``: none), at most ``left``, and never less than :data:`LEAST` (a call
    whose time is up waits that long, then fails with its client's timeout error)."""
    limit = max(left, LEAST)
    if own is None:
        return limit
    mine = capped_seconds(own)  # NaN: as if the caller had given none
    return limit if mine is None else max(min(mine, limit), LEAST)
