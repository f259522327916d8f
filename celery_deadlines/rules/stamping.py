"""What a published message carries: the one core of both publish paths (pure).

:meth:`DeadlineTask.apply_async` and the ``before_task_publish`` hook (plain tasks sent
from a deadline task, ``send_task`` by name, Celery's own ``chord_unlock``) take the
same steps: read the publish's own deadlines (:func:`own_deadlines`), combine them with
what the message inherits (:func:`stamp_for`: a child can only shorten a deadline), and
write the headers and Celery's ``expires`` (:func:`write`). ``now`` and the horizon
(``deadlines_max_budget``) are passed in; nothing here reads a clock or a setting.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from datetime import datetime, timedelta
from typing import Any, Final, NamedTuple, get_args

from ..errors import InvalidDeadline
from . import wire
from .budgets import Governed, Source, capped_seconds, govern, parse_budget, parse_instant

#: Call options this package understands (taken out before Celery sees them).
CALL_OPTIONS: Final = frozenset({"budget", "deadline", "delivery_budget", "delivery_deadline"})

#: The headers of Celery's own message (protocol 2, ``celery.app.amqp.AMQP.as_task_v2``),
#: each with what sets it. Celery merges a publish's ``headers`` over them, so a header
#: of one of these names would replace the field: a caller's (or a beat row's)
#: ``{"id": ...}`` would give the message another run's id, ``{"task": ...}`` run it as
#: another task, ``{"retries": ...}`` make it an older or newer message of its run,
#: ``{"group": ...}`` count it in another group's chord.
PROTOCOL_HEADERS: Final[Mapping[str, str]] = {
    "id": "task_id=",
    "task": "the task itself (app.send_task's name)",
    "retries": "Task.retry()",
    "root_id": "root_id=",
    "parent_id": "parent_id=",
    "group": "group_id=",
    "group_index": "group_index=",
    "eta": "eta= or countdown=",
    "expires": "expires=",
    "timelimit": "time_limit= and soft_time_limit=",
    "shadow": "shadow=",
    "ignore_result": "ignore_result=",
    "argsrepr": "argsrepr=",
    "kwargsrepr": "kwargsrepr=",
    "origin": "Celery (the publishing host)",
    "lang": "Celery",
    "replaced_task_nesting": "Task.replace()",
    "stamped_headers": "Celery's stamping (Signature.stamp())",
    "stamps": "Celery's stamping (Signature.stamp())",
}

#: The values ``x_deadline_source`` may name; any other value a header carries is read as
#: ``"call"`` (a header is written by whoever publishes, and says nothing trusted).
SOURCES: Final[frozenset[str]] = frozenset(get_args(Source))


class Inherited(NamedTuple):
    """What a message inherits from the task or scope it is published from.

    ``unreadable`` holds a parent's deadline header that could not be read: it is
    passed on as it is, so the worker refuses it with ``invalid_deadline`` instead of
    running the child with no deadline.
    """

    deadline: datetime | None = None
    delivery: datetime | None = None
    source: Source = "parent"
    origin: str | None = None
    unreadable: object = None


NOTHING: Final = Inherited()


class Own(NamedTuple):
    """A publish's own deadlines: from its call options, else from an explicit header."""

    deadline: datetime | None = None
    source: Source | None = None
    delivery: datetime | None = None


#: A publish that names no deadline of its own.
NO_OWN: Final = Own()


class Stamp(NamedTuple):
    """The deadlines a message will carry, and Celery's ``expires`` (the deadline: never
    later, since an earlier ``expires`` became the deadline)."""

    governed: Governed
    delivery: datetime | None
    origin: str | None
    expires: datetime | None


def reserved_headers(headers: Mapping[Any, Any] | None) -> list[str]:
    """The keys of ``headers`` a publisher may not set, sorted: the fields of Celery's own
    message (:data:`PROTOCOL_HEADERS`), which a header would replace. Empty when every
    header is the publisher's own (``None``: no headers). Exact names: Celery reads
    ``id``, never ``ID``. The one rule for a caller's ``apply_async(headers=...)`` and a
    beat row's ``headers``."""
    if not headers:
        return []
    return sorted(key for key in headers if type(key) is str and key in PROTOCOL_HEADERS)


def own_deadlines(
    call: MutableMapping[str, Any],
    headers: MutableMapping[str, Any],
    now: datetime,
    horizon: timedelta,
) -> Own:
    """The deadlines a publish names itself: ``budget``/``deadline`` (and the delivery
    pair) taken out of the call options ``call``, else the ``x_deadline`` header already
    in ``headers`` (explicit, or copied by ``retry()``). Raises :class:`InvalidDeadline`
    for a bad value."""
    own: datetime | None = None
    source: Source | None = None
    delivery: datetime | None = None
    if not CALL_OPTIONS.isdisjoint(call):
        own = call_instant(call, "", now, horizon)
        source = "call" if own is not None else None
        delivery = call_instant(call, "delivery_", now, horizon)
    if own is None and wire.DEADLINE_HEADER in headers:
        own = wire.decode(headers[wire.DEADLINE_HEADER], now=now, horizon=horizon)
        source = header_source(headers)
    return Own(own, source if own is not None else None, delivery)


def header_source(headers: Mapping[str, Any]) -> Source:
    """Where a message's own ``x_deadline`` says it came from: one of :data:`SOURCES`,
    else ``"call"`` (the header is the publisher's word, never an authority)."""
    source = headers.get(wire.SOURCE_HEADER)
    return source if type(source) is str and source in SOURCES else "call"  # type: ignore[return-value]


def stamp_for(
    own: Own, parent: Inherited, *, now: datetime, expires: object, task_id: str | None
) -> Stamp:
    """Combine a publish's own deadlines with what it inherits: the earlier wins (the
    clamp is reported in ``governed.clamped_from``). Celery's ``expires`` shortens the
    deadline: Celery discards the message then, so the run has no more time than that;
    an earlier one governs (source ``expires``), a later one changes nothing, and with
    no deadline it makes none (it is Celery's alone, as without this package). The
    origin is the parent's when the deadline is inherited, else this message's own id."""
    governed = govern(own.deadline, own.source, parent.deadline, parent.source)
    if governed.deadline is not None and expires is not None:
        expiry = expiry_of(expires, now)
        if expiry is not None and expiry < governed.deadline:
            governed = Governed(expiry, "expires")
    delivery = earlier(own.delivery, parent.delivery)
    origin = parent.origin if governed.source in ("parent", "scope") else task_id
    # the deadline is never later than ``expires``: Celery's check is set to it
    return Stamp(governed, delivery, origin, governed.deadline)


def for_deadline_task(stamp: Stamp, *, expires: object, starts_at: datetime | None) -> Stamp:
    """The stamp of a DeadlineTask's own message: Celery's ``expires`` only where it adds
    a check. A worker running the DeadlineTask refuses the message by its claim gate
    (``DeadlineRequest``) when it hands it to the pool, which a prefork worker does the
    moment the message arrives; Celery's ``expires`` would add a second check of the same
    instant to every message. It stays when the caller set one (the earlier of the
    two is kept, and Celery enforces it) and on a message that waits in the worker for
    its ``eta`` or ``countdown`` (refused on arrival, not at its ETA). Plain tasks'
    messages (a DeadlineTask's children) keep it always: no claim gate reads them."""
    if expires is None and starts_at is None:
        return stamp._replace(expires=None)
    return stamp


def write(headers: MutableMapping[str, Any], stamp: Stamp) -> None:
    """Write the deadlines into message headers, and ``expires`` capped at the deadline
    (the header only, no broker TTL: RabbitMQ would drop an expired message without the
    refusal being recorded, and the caller would wait for nothing)."""
    governed = stamp.governed
    if governed.deadline is not None:
        headers[wire.DEADLINE_HEADER] = wire.encode(governed.deadline)
        headers[wire.SOURCE_HEADER] = governed.source
        if stamp.origin:
            headers[wire.ORIGIN_HEADER] = stamp.origin
    if stamp.delivery is not None:
        headers[wire.DELIVERY_DEADLINE_HEADER] = wire.encode(stamp.delivery)
    if stamp.expires is not None:
        headers["expires"] = stamp.expires.isoformat()


def call_instant(
    options: MutableMapping[str, Any], kind: str, now: datetime, horizon: timedelta
) -> datetime | None:
    """Take ``kind_budget``/``kind_deadline``-style options out of ``options``.

    ``kind`` is ``""`` for the execution deadline and ``"delivery_"`` for delivery.
    Returns the instant they name, ``None`` when neither was given, and raises
    :class:`InvalidDeadline` for bad values or both at once.
    """
    budget = options.pop(f"{kind}budget", None)
    deadline = options.pop(f"{kind}deadline", None)
    return own_instant(
        budget, deadline, names=(f"{kind}budget", f"{kind}deadline"), now=now, horizon=horizon
    )


def own_instant(
    budget: object,
    deadline: object,
    *,
    names: tuple[str, str],
    now: datetime,
    horizon: timedelta,
) -> datetime | None:
    """The instant a budget (from ``now``) or an aware deadline names, within ``horizon``;
    ``names`` say what the error message calls them."""
    budget_name, deadline_name = names
    if budget is not None and deadline is not None:
        raise InvalidDeadline(f"pass {budget_name} or {deadline_name}, not both")
    if deadline is not None:
        instant = parse_instant(deadline, name=deadline_name)
        if instant - now > horizon:
            raise InvalidDeadline(
                f"{deadline_name} {instant.isoformat()} is more than {horizon} away "
                "(setting deadlines_max_budget)"
            )
        return instant
    span = parse_budget(budget, name=budget_name, maximum=horizon)
    return None if span is None else now + span


def expiry_of(expires: object, now: datetime) -> datetime | None:
    """Celery's ``expires`` option as an instant: seconds after ``now`` (capped at a
    century), an aware datetime, or an aware ISO 8601 string; ``None`` for no value or
    one read no other way (a naive instant is in Celery's timezone, which Celery reads:
    it still enforces it, and it never extends the deadline)."""
    if isinstance(expires, (int, float)) and not isinstance(expires, bool):
        after = capped_seconds(expires)  # NaN: no expiry this package can read
        return None if after is None else now + after
    if isinstance(expires, datetime):
        return expires if expires.tzinfo is not None else None
    if isinstance(expires, str):
        try:
            parsed = datetime.fromisoformat(expires)
        except ValueError:
            return None
        return parsed if parsed.tzinfo is not None else None
    return None


def delivery_deadline(
    headers: MutableMapping[str, Any], now: datetime, horizon: timedelta
) -> datetime | None:
    """The delivery deadline a message carries, ``None`` if absent or unreadable."""
    raw = headers.get(wire.DELIVERY_DEADLINE_HEADER)
    if raw is None:
        return None
    try:
        return wire.decode(raw, now=now, horizon=horizon)
    except InvalidDeadline:
        return None


def earlier(first: datetime | None, second: datetime | None) -> datetime | None:
    """The earlier of two optional instants (``None`` means "no deadline")."""
    if first is None:
        return second
    if second is None:
        return first
    return min(first, second)


def carries_deadlines(headers: MutableMapping[str, Any]) -> bool:
    """Does a message carry a deadline header at all? (Without one, :func:`read_headers`
    needs no horizon: callers skip reading ``deadlines_max_budget``.)"""
    return wire.DEADLINE_HEADER in headers or wire.DELIVERY_DEADLINE_HEADER in headers


def carried_nothing(headers: Mapping[str, Any], task_id: str | None) -> Inherited:
    """What a message without deadline headers carries: its origin alone."""
    return Inherited(origin=origin_of(headers, task_id))


def origin_of(headers: Mapping[str, Any], task_id: str | None) -> str | None:
    """The task whose publish computed the deadline: the header, if it is a task id
    (a string of at most 255 characters, as Celery's ids are kept), else this task."""
    origin = headers.get(wire.ORIGIN_HEADER)
    if isinstance(origin, str) and 0 < len(origin) <= 255:
        return origin
    return task_id


def read_headers(
    headers: MutableMapping[str, Any], now: datetime, horizon: timedelta, task_id: str | None
) -> Inherited:
    """The deadlines carried by a message's headers (unreadable ones kept as they are)."""
    raw = headers.get(wire.DEADLINE_HEADER)
    if raw is None and wire.DELIVERY_DEADLINE_HEADER not in headers:
        return carried_nothing(headers, task_id)  # nothing to read (nor ``now``, ``horizon``)
    origin = origin_of(headers, task_id)
    deadline = unreadable = None
    if raw is not None:
        try:
            deadline = wire.decode(raw, now=now, horizon=horizon)
        except InvalidDeadline:
            unreadable = raw
    # an unreadable delivery deadline is for the delivery gates to judge, not this one
    delivery = delivery_deadline(headers, now, horizon)
    return Inherited(deadline, delivery, "parent", origin, unreadable)
