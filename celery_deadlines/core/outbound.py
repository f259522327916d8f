"""The deadline crosses to the services a body calls: the headers that carry it, the
outbound gate, and each call's timeout.

The current deadline is the one a task published right here would inherit
(:func:`celery_deadlines.core.propagation.inherited`): the running task's, a
:func:`~celery_deadlines.deadline_scope`'s, or a request's scope
(:mod:`celery_deadlines.core.ingress`, the Django middleware). Inside an attempt it is judged
on the attempt's monotonic clock, as ``self.remaining()`` is; elsewhere on the wall
clock. The rules are :mod:`celery_deadlines.rules.outgoing`.

* :func:`deadline_headers` gives the headers that say it (``deadlines_outbound_headers``),
  for any client; nothing without a deadline.
* :func:`prepare` is the outbound gate for one call, for the client adapters
  (:mod:`~celery_deadlines.contrib.httpx`, :mod:`~celery_deadlines.contrib.requests`,
  :mod:`~celery_deadlines.contrib.grpc`) and for clients of your own: it refuses a call
  with no more than its reserve left (``deadlines_outbound_reserve``) with
  :class:`DeadlineRefused` (gate ``outbound``), logged once and sent as
  ``deadline_refused``, before anything is sent; or gives the call its headers and
  its timeout. :meth:`OutboundCall.again` is the same gate for each attempt a client
  library makes of its own (a retry): when it starts, and before the pause that
  precedes it, with the headers and the timeout of that instant.

This module imports no client library: each adapter imports its own, and only when the
application imports the adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NoReturn

from celery import current_app

from ..clock import get_clock
from ..conf import OUTBOUND_HEADERS, OUTBOUND_RESERVE, Settings, settings_for
from ..errors import InvalidDeadline
from ..rules import outgoing
from ..rules.budgets import DurationLike, capped_seconds, parse_duration
from ..rules.gates import Decision
from ..rules.incoming import Syntax
from ..rules.quoting import shown
from ..rules.stamping import Inherited
from .propagation import attempt_state, current_task, inherited
from .refusals import report_refusal

__all__ = ["OutboundCall", "deadline_headers", "prepare"]


@dataclass(frozen=True, slots=True)
class _Reading:
    """What governs a call starting now: the inherited deadlines, the clock reading they
    are judged at (an attempt's: on its monotonic clock) and the monotonic reading."""

    inherited: Inherited
    now: datetime
    monotonic: float
    task: Any


def _read() -> _Reading:
    clock = get_clock()
    monotonic = clock.monotonic()
    task = current_task()
    state = attempt_state(task) if task is not None else None
    if state is not None and state.anchor is not None:
        # an attempt's time runs on the monotonic clock from its anchor, as remaining()
        # does: a wall-clock step during the attempt neither adds nor removes time
        anchor = state.anchor
        now = anchor.started_at + timedelta(seconds=monotonic - anchor.started_monotonic)
    else:
        now = clock.now()
    return _Reading(inherited(), now, monotonic, task)


def _settings(app: Any, task: Any) -> Settings:
    return settings_for(app or (task.app if task is not None else current_app))


def deadline_headers(*, app: Any = None) -> dict[str, str]:
    """The headers that carry the current deadline to a service you call (inside a task,
    a ``deadline_scope`` or a request's scope): ``{name: value}`` for each header of
    ``deadlines_outbound_headers``; ``{}`` without a deadline.

    They say the deadline itself; the relative ones (``grpc-timeout``, milliseconds) are
    the time left now, rounded down, and ``0`` once it has passed. Settings are the
    Celery app's (``app``, the running task's, or the current one). Raises
    :class:`InvalidDeadline` when the running task's deadline header cannot be read.
    """
    reading = _read()
    if reading.inherited.unreadable is not None:
        raise InvalidDeadline(
            f"the current deadline cannot be read: {shown(reading.inherited.unreadable, 40)}"
        )
    deadline = reading.inherited.deadline
    if deadline is None:
        return {}
    names = _settings(app, reading.task).get(OUTBOUND_HEADERS)
    return outgoing.headers(names, deadline=deadline, now=reading.now)


@dataclass(frozen=True, slots=True)
class OutboundCall:
    """A call the outbound gate let start: send ``headers`` and give it at most
    ``timeout`` (what was left of the deadline, less the reserve, when it was admitted).
    :meth:`left` and :meth:`cap` are judged on the monotonic clock from that instant;
    :meth:`again` is the gate for each further attempt a client makes of it."""

    headers: Mapping[str, str]
    timeout: timedelta
    deadline: datetime
    admitted_monotonic: float
    #: the reading the gate judged the call at (an attempt's: on its monotonic clock)
    admitted_at: datetime
    reserve: timedelta
    names: Mapping[str, Syntax]
    target: str

    def left(self) -> timedelta:
        """What remains of the call's time now (negative once it is up)."""
        elapsed = timedelta(seconds=get_clock().monotonic() - self.admitted_monotonic)
        return self.timeout - elapsed

    def cap(self, own: float | None) -> float:
        """A timeout for the phase of the call starting now, in seconds for the client:
        the caller's own (``None``: none) at most what is left of the call, at least a
        microsecond (a client reads 0 as "do not wait" or "no timeout")."""
        return outgoing.cap(own, self.left()).total_seconds()

    def again(self, pause: float = 0.0) -> OutboundCall:
        """The outbound gate for another attempt of this call (a client's own retry)
        starting now, or once the client's ``pause`` (seconds: its backoff, a
        ``Retry-After``) is over: refused as :func:`prepare` refuses, reported the same
        way (a retry that could not start in time is refused before its pause), or the
        attempt as of now, with the headers and the timeout of this instant."""
        monotonic = get_clock().monotonic()
        now = self.admitted_at + timedelta(seconds=monotonic - self.admitted_monotonic)
        wait = capped_seconds(pause) or outgoing.ZERO  # NaN: no pause
        decision = outgoing.admit(
            deadline=self.deadline,
            now=now,
            reserve=self.reserve,
            target=self.target,
            pause=max(wait, outgoing.ZERO),
        )
        if not decision.allowed:
            _refuse(decision, current_task(), self.target)
        return _admitted(self.deadline, now, monotonic, self.reserve, self.names, self.target)


def _admitted(
    deadline: datetime,
    now: datetime,
    monotonic: float,
    reserve: timedelta,
    names: Mapping[str, Syntax],
    target: str,
) -> OutboundCall:
    call = outgoing.call_for(deadline=deadline, now=now, reserve=reserve, names=names)
    return OutboundCall(
        call.headers, call.timeout, call.deadline, monotonic, now, reserve, names, target
    )


def _refuse(decision: Decision, task: Any, target: str) -> NoReturn:
    """Report a refusal at the outbound gate (logged once, ``deadline_refused``) and raise it."""
    task_id = task.request.id if task is not None else None
    report_refusal(task or target, task_id, task.name if task is not None else target, decision)
    raise decision.refusal()


def prepare(
    target: str, *, reserve: DurationLike | None = None, app: Any = None
) -> OutboundCall | None:
    """The outbound gate for a call to ``target`` (its method and host: the log line, and
    the metrics' ``task`` label outside a task) starting now.

    ``None`` without a deadline: send the call as written. Otherwise the call with its
    headers and timeout, or, with no more than ``reserve`` (default:
    ``deadlines_outbound_reserve``) left, :class:`DeadlineRefused` (gate ``outbound``,
    ``insufficient_budget`` or ``deadline_passed``; ``invalid_deadline`` for a running
    task's unreadable deadline), logged once at WARNING and sent as ``deadline_refused``
    before anything is sent. A bad ``reserve`` raises :class:`InvalidDeadline`.
    """
    reading = _read()
    governing = reading.inherited
    if governing.deadline is None and governing.unreadable is None:
        return None
    settings = _settings(app, reading.task)
    kept = (
        settings.get(OUTBOUND_RESERVE)
        if reserve is None
        else parse_duration(reserve, name="reserve", allow_zero=True)
    )
    if governing.deadline is None:
        decision = outgoing.unreadable(now=reading.now, target=target, value=governing.unreadable)
    else:
        decision = outgoing.admit(
            deadline=governing.deadline, now=reading.now, reserve=kept, target=target
        )
    if not decision.allowed:
        _refuse(decision, reading.task, target)
    assert governing.deadline is not None
    names = settings.get(OUTBOUND_HEADERS)
    return _admitted(governing.deadline, reading.now, reading.monotonic, kept, names, target)
