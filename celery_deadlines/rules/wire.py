"""The wire format: header names and how a deadline is written and read.

A deadline travels as an absolute UTC instant in float epoch seconds, never as a
duration, so every hop compares against the same instant however long the message
waited. The names below are the whole wire contract; they carry the ``x_`` prefix
because Celery strips its own option names (``expires``, ``eta``, ...) from
``request.headers``.

=========================  ===================================================
header                     meaning
=========================  ===================================================
``x_deadline``             execution deadline: no hop *starts* work after it
``x_delivery_deadline``    until when a completion notice is still worth sending
``x_deadline_origin``      id of the task whose publish computed the deadline
``x_deadline_source``      where it came from: call, task, setting, default,
                           scope, parent or expires
``x_deadline_occurrence``  a scheduled run's occurrence: ``{"schedule",
                           "zone", "local", "at"}`` (the local wall time it
                           was resolved from, and the UTC instant)
=========================  ===================================================

Celery's own ``expires`` header is set to the same instant, so Flower and workers
without this package respect it too. The broker's per-message TTL (AMQP
``expiration``) is deliberately *not* set: RabbitMQ would drop an expired message
without anyone recording why, and a caller waiting on its result would wait for nothing.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from ..errors import InvalidDeadline
from .quoting import shown

DEADLINE_HEADER: Final = "x_deadline"
DELIVERY_DEADLINE_HEADER: Final = "x_delivery_deadline"
ORIGIN_HEADER: Final = "x_deadline_origin"
SOURCE_HEADER: Final = "x_deadline_source"
OCCURRENCE_HEADER: Final = "x_deadline_occurrence"


#: The last whole second a datetime holds, in epoch seconds (a float cannot hold the
#: microseconds after it): the fast path below reads no larger header.
_LAST_EPOCH: Final = datetime.max.replace(tzinfo=UTC, microsecond=0).timestamp()


def encode(instant: datetime) -> float:
    """The wire form of an aware instant: float epoch seconds."""
    return instant.timestamp()


def decode(value: object, *, now: datetime, horizon: timedelta) -> datetime:
    """Read a deadline header, or raise :class:`InvalidDeadline` saying what is wrong.

    Accepted: a finite, non-negative number of epoch seconds (the form this package
    writes) or an ISO-8601 string with a UTC offset (for producers in other languages).
    Refused: anything else, including booleans, NaN, infinities, naive ISO strings and
    instants more than ``horizon`` after ``now`` (a clock or unit error, not a budget).
    A bad header is never read as "no deadline".
    """
    if type(value) is float and 0.0 <= value <= _LAST_EPOCH:  # NaN fails both comparisons
        # the form this package writes, read at every hop: the checks below, inline
        instant = datetime.fromtimestamp(value, UTC)
    elif isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidDeadline(f"deadline header has type {type(value).__name__}: {shown(value)}")
    else:
        instant = _decode_iso(value) if isinstance(value, str) else _decode_epoch(value)
    if instant - now > horizon:
        raise InvalidDeadline(
            f"deadline {instant.isoformat()} is more than {horizon} after the clock "
            f"reading {now.isoformat()}"
        )
    return instant


def _decode_epoch(value: float) -> datetime:
    # an int too large for a float is out of range, not an error of math.isfinite
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidDeadline(f"deadline header is not a finite number: {shown(value)}")
    if value < 0:
        raise InvalidDeadline(f"deadline header is negative: {shown(value)}")
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise InvalidDeadline(f"deadline header is out of range: {shown(value)}") from exc


def _decode_iso(value: str) -> datetime:
    try:
        instant = datetime.fromisoformat(value)
    except ValueError as exc:
        raise InvalidDeadline(
            f"deadline header is not a number or ISO-8601: {shown(value)}"
        ) from exc
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise InvalidDeadline(
            f"deadline header is a naive datetime (no UTC offset): {shown(value)}"
        )
    return in_utc(instant, shown(value))


def in_utc(instant: datetime, shown_as: str) -> datetime:
    """An aware ``instant`` in UTC, or :class:`InvalidDeadline` when UTC cannot hold it
    (``0001-01-01T00:00:00+01:00`` is in the year 0)."""
    try:
        return instant.astimezone(UTC)
    except OverflowError as exc:
        raise InvalidDeadline(f"{shown_as} is outside the range of a UTC datetime") from exc


def decode_occurrence(header: object) -> dict[str, Any]:
    """A scheduled run's columns from its ``x_deadline_occurrence`` header (``{}`` when
    there is none): ``not_before`` (``None`` if unreadable: the deadline still governs),
    ``schedule``, ``schedule_zone``, ``schedule_local``, cut to their columns' lengths."""
    if not isinstance(header, dict):
        return {}
    not_before: datetime | None = None
    try:  # an aware instant in UTC or nothing: a naive one could not be compared
        at = datetime.fromisoformat(str(header.get("at")))
        if at.utcoffset() is not None:
            not_before = in_utc(at, "at")
    except ValueError:  # InvalidDeadline is one
        pass
    return {
        "not_before": not_before,
        "schedule": str(header.get("schedule") or "")[:255],
        "schedule_zone": str(header.get("zone") or "")[:64],
        "schedule_local": str(header.get("local") or "")[:32],
    }
