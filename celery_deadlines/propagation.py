"""How a deadline reaches every message: inheritance, scopes and the publish hook.

A message published while a task runs inherits that task's deadlines (retries
included: the retried message is published from inside the attempt). A
:func:`deadline_scope` gives code outside a worker the same thing, so a group or chord
started from a web view shares *one* deadline computed once. The ``before_task_publish``
receiver stamps messages that did not go through :meth:`DeadlineTask.apply_async`
(plain tasks sent from a deadline task, ``app.send_task`` by name, Celery's own
``chord_unlock``...) and sets Celery's ``expires`` header to the governing deadline.

Receivers of ``before_task_publish`` cannot refuse a publish (Celery logs and swallows
their exceptions), so the enqueue gate lives in :meth:`DeadlineTask.apply_async`; a
message stamped here is gated when a worker claims it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any, Final, NamedTuple

from celery import current_app
from celery._state import get_current_task

from . import wire
from .budgets import DurationLike, Governed, Source, govern, parse_budget, parse_instant
from .clock import get_clock
from .conf import settings_for
from .errors import InvalidDeadline

logger = logging.getLogger("celery_deadlines")

#: Call options this package understands (taken out before Celery sees them).
CALL_OPTIONS: Final = frozenset({"budget", "deadline", "delivery_budget", "delivery_deadline"})


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

#: Keys under which DeadlineTask keeps an attempt's state on ``task.request``.
CARRIED: Final = "celery_deadlines"
ANCHOR: Final = "celery_deadlines_anchor"
ATTEMPT: Final = "celery_deadlines_attempt"

_scope: ContextVar[Inherited | None] = ContextVar("celery_deadlines_scope", default=None)


@contextmanager
def deadline_scope(
    *,
    budget: DurationLike | None = None,
    deadline: datetime | None = None,
    delivery_budget: DurationLike | None = None,
    delivery_deadline: datetime | None = None,
    app: Any = None,
) -> Iterator[Inherited]:
    """Give everything published inside the block one deadline, computed once, here.

    Nested scopes and a running task can only shorten it. Raises
    :class:`InvalidDeadline` for a naive datetime or a bad budget, or when both a
    budget and a deadline are given.
    """
    settings = settings_for(app or current_app)
    now = get_clock().now()
    own = _own_instant(budget, deadline, "budget", "deadline", now, settings.max_budget)
    own_delivery = _own_instant(
        delivery_budget,
        delivery_deadline,
        "delivery_budget",
        "delivery_deadline",
        now,
        settings.max_budget,
    )
    outer = inherited()
    governed = govern(own, "scope", outer.deadline, outer.source)
    scope = Inherited(
        deadline=governed.deadline,
        delivery=earlier(own_delivery, outer.delivery),
        source=governed.source or "scope",
        origin=outer.origin,
        unreadable=outer.unreadable,
    )
    token = _scope.set(scope)
    try:
        yield scope
    finally:
        _scope.reset(token)


def inherited() -> Inherited:
    """The deadlines a message published right now inherits (scope and running task)."""
    scope = _scope.get()
    parent = _parent()
    if scope is None:
        return parent
    if parent is NOTHING:
        return scope
    governed = govern(scope.deadline, scope.source, parent.deadline, "parent")
    return Inherited(
        deadline=governed.deadline,
        delivery=earlier(scope.delivery, parent.delivery),
        source=governed.source or "parent",
        origin=parent.origin,
        unreadable=parent.unreadable,
    )


def _parent() -> Inherited:
    task = get_current_task()
    if task is None:
        return NOTHING
    request = task.request
    if request.called_directly:
        return NOTHING
    known = vars(request).get(CARRIED)
    if isinstance(known, Inherited):  # set by DeadlineTask.before_start: already parsed
        return known
    headers = request.headers or {}
    if wire.DEADLINE_HEADER not in headers and wire.DELIVERY_DEADLINE_HEADER not in headers:
        return NOTHING
    return read_headers(headers, get_clock().now(), settings_for(task.app).max_budget, request.id)


def read_headers(
    headers: dict[str, Any], now: datetime, horizon: timedelta, task_id: str | None
) -> Inherited:
    """The deadlines carried by a message's headers (unreadable ones kept as they are)."""
    origin = headers.get(wire.ORIGIN_HEADER) or task_id
    deadline = unreadable = None
    raw = headers.get(wire.DEADLINE_HEADER)
    if raw is not None:
        try:
            deadline = wire.decode(raw, now=now, horizon=horizon)
        except InvalidDeadline:
            unreadable = raw
    # an unreadable delivery deadline is for the delivery gates to judge, not this one
    delivery = delivery_deadline(headers, now, horizon)
    return Inherited(deadline, delivery, "parent", origin, unreadable)


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
    return _own_instant(budget, deadline, f"{kind}budget", f"{kind}deadline", now, horizon)


def stamp(
    headers: MutableMapping[str, Any],
    governed: Governed,
    delivery: datetime | None,
    origin: str | None,
) -> None:
    """Write the governing deadlines into message headers."""
    if governed.deadline is not None:
        headers[wire.DEADLINE_HEADER] = wire.encode(governed.deadline)
        headers[wire.SOURCE_HEADER] = governed.source
        if origin:
            headers[wire.ORIGIN_HEADER] = origin
    if delivery is not None:
        headers[wire.DELIVERY_DEADLINE_HEADER] = wire.encode(delivery)


def earlier_expiry(expires: object, deadline: datetime, now: datetime) -> datetime:
    """Celery's ``expires`` option (seconds, datetime or ISO string) capped at ``deadline``."""
    current: datetime | None = None
    if isinstance(expires, (int, float)) and not isinstance(expires, bool):
        current = now + timedelta(seconds=expires)
    elif isinstance(expires, datetime) and expires.tzinfo is not None:
        current = expires
    elif isinstance(expires, str):
        try:
            parsed = datetime.fromisoformat(expires)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            current = parsed
    return deadline if current is None or deadline < current else current


def on_before_task_publish(
    sender: str | None = None,
    headers: dict[str, Any] | None = None,
    properties: dict[str, Any] | None = None,
    **_: Any,
) -> None:
    """``before_task_publish`` receiver: inherit, stamp, and set ``expires``.

    Messages already stamped by :meth:`DeadlineTask.apply_async` (or copied by
    ``retry()``) carry ``x_deadline_source`` and are left as they are.
    """
    if headers is None or wire.SOURCE_HEADER in headers:
        return
    given = (properties.keys() & CALL_OPTIONS) if properties else ()
    parent = inherited()
    explicit = headers.get(wire.DEADLINE_HEADER)
    if not given and explicit is None and parent.deadline is None and parent.unreadable is None:
        if parent.delivery is not None and wire.DELIVERY_DEADLINE_HEADER not in headers:
            headers[wire.DELIVERY_DEADLINE_HEADER] = wire.encode(parent.delivery)
        return
    now = get_clock().now()
    horizon = settings_for(current_app).max_budget
    task_id = headers.get("id")
    try:
        own: datetime | None = None
        own_source: Source | None = None
        own_delivery: datetime | None = None
        if given and properties is not None:
            own = call_instant(properties, "", now, horizon)
            own_delivery = call_instant(properties, "delivery_", now, horizon)
        if own is None and explicit is not None:
            own = wire.decode(explicit, now=now, horizon=horizon)
        own_source = "call" if own is not None else None
    except InvalidDeadline as exc:
        # A receiver cannot raise to the caller: keep the bad value so the worker
        # refuses the message with invalid_deadline and the caller's result says so.
        logger.error("%s[%s]: unusable deadline at publish: %s", sender, task_id, exc)
        headers[wire.DEADLINE_HEADER] = explicit if explicit is not None else str(exc)
        return
    if parent.unreadable is not None and own is None:
        headers[wire.DEADLINE_HEADER] = parent.unreadable
        return
    governed = govern(own, own_source, parent.deadline, parent.source)
    if governed.clamped_from is not None:
        log_clamp(sender, task_id, governed)
    delivery = earlier(own_delivery or delivery_deadline(headers, now, horizon), parent.delivery)
    origin = parent.origin if governed.source in ("parent", "scope") else task_id
    stamp(headers, governed, delivery, origin)
    if governed.deadline is not None:
        # The expires header only, no broker TTL: RabbitMQ would drop an expired message
        # without the refusal being recorded, and the caller would wait for nothing.
        headers["expires"] = earlier_expiry(
            headers.get("expires"), governed.deadline, now
        ).isoformat()


def log_clamp(sender: object, task_id: object, governed: Governed) -> None:
    """Make a clamp visible: an explicit deadline later than the inherited one was cut."""
    assert governed.clamped_from is not None
    assert governed.deadline is not None
    logger.info(
        "%s[%s]: deadline %s clamped to the inherited %s (%s)",
        sender,
        task_id,
        governed.clamped_from.isoformat(),
        governed.deadline.isoformat(),
        governed.source,
    )


def delivery_deadline(
    headers: dict[str, Any], now: datetime, horizon: timedelta
) -> datetime | None:
    """The delivery deadline a message carries, ``None`` if absent or unreadable."""
    raw = headers.get(wire.DELIVERY_DEADLINE_HEADER)
    if raw is None:
        return None
    try:
        return wire.decode(raw, now=now, horizon=horizon)
    except InvalidDeadline:
        return None


def _own_instant(
    budget: object,
    deadline: object,
    budget_name: str,
    deadline_name: str,
    now: datetime,
    horizon: timedelta,
) -> datetime | None:
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


def earlier(first: datetime | None, second: datetime | None) -> datetime | None:
    """The earlier of two optional instants (``None`` means "no deadline")."""
    if first is None:
        return second
    if second is None:
        return first
    return min(first, second)
