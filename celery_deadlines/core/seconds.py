"""The gates in epoch seconds: what a worker without the ledger does for a message that
is clearly in time, and how a task's own budget is stamped on a plain publish, with no
``datetime`` built on either side.

A deadline header as this package writes it is a float of epoch seconds, and so is the
clock's own reading (:func:`celery_deadlines.clock.epoch`): comparing the two is the
inherent cost of a gate, and building the datetimes the full rule compares costs more
than the rest of it. Each function here decides only what the full rule (the claim gate
of :class:`~celery_deadlines.core.request.DeadlineRequest`, ``DeadlineTask``'s attempt gate
and ``_stamp``) would decide for the same message, and answers ``None`` ("judge it in
full") for any other: a deadline within :data:`EDGE` of the last start or the horizon,
another clock as the judge (a clock-skew budget), the ledger, tracing, any option of
the caller's. ``tests/unit/core/test_seconds.py`` holds each to the full rule.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final, NamedTuple

from .. import clock, conf
from ..conf import settings_for
from ..rules import stamping, wire
from ..rules.budgets import UNSET, Source
from ..rules.gates import TICK
from . import options, propagation, telemetry
from .propagation import AttemptState

#: Celery's call options that move or bound a message's start (a publish with one is
#: stamped by the full rule).
_MOVES_START: Final = frozenset({"eta", "countdown", "expires"})
#: Headers a caller may give that name a deadline of its own.
_DEADLINE_HEADERS: Final = frozenset({wire.DEADLINE_HEADER, wire.DELIVERY_DEADLINE_HEADER})


#: How clearly in time (seconds) a deadline header must be for a gate to admit it in
#: epoch seconds (:class:`InSeconds`): a float cannot tell apart two instants a
#: microsecond apart so far from 1970, and a message this close to its last start, or to
#: the horizon, is judged with datetimes.
EDGE: Final = 0.001


class InSeconds(NamedTuple):
    """What a worker's gates compare a deadline header with, in the wire's unit (epoch
    seconds), worked out once per task and settings (:func:`limits_of`): a message
    whose deadline is more than ``low`` and less than ``high`` seconds ahead is clearly
    in time (its last start, the deadline less the reserve, is more than :data:`EDGE`
    ahead, and it is within the horizon by more than that); any other is judged with
    datetimes, by the full rule."""

    #: the task's reserve (at least :data:`~celery_deadlines.rules.gates.TICK`) + EDGE
    low: float
    #: ``deadlines_max_budget`` - EDGE
    high: float
    #: ``deadlines_max_budget``, what a header's deadline is read against
    horizon: timedelta
    #: whether deadlines are judged by the worker's own clock (no clock-skew budget:
    #: with one, the ledger's clock decides, as the clock watch estimates it)
    local: bool
    #: the task's budget in seconds, ``None`` for none, and where it is said, when a
    #: publish that names nothing of its own may be stamped with it in epoch seconds
    #: (it is longer than the reserve by more than EDGE, and there is no delivery
    #: budget): else ``None``, and such a publish is stamped by the full rule
    budget: float | None
    budget_source: Source | None
    #: whether the task says no budget and no delivery budget anywhere: a publish that
    #: names nothing of its own and inherits nothing is Celery's own message
    names_nothing: bool


#: The task attribute a task's :class:`InSeconds` is kept in, with what it came from.
_IN_SECONDS: Final = "_celery_deadlines_in_seconds"


def limits_of(task: Any, settings: conf.Settings) -> InSeconds:
    """``task``'s :class:`InSeconds` under ``settings``: kept on the task, as its
    :class:`~celery_deadlines.core.options.Times` is, while the settings' stamp and the
    task's ``budget``, ``delivery_budget`` and ``reserve`` attributes are what they
    were."""
    kept: tuple[conf.Settings, object, tuple[object, ...], InSeconds] | None = getattr(
        task, _IN_SECONDS, None
    )
    stamp = settings.stamp()
    if kept is not None and kept[0] is settings and kept[1] == stamp:
        attributes = kept[2]
        if (
            attributes[0] is getattr(task, "budget", UNSET)
            and attributes[1] is getattr(task, "delivery_budget", UNSET)
            and attributes[2] is getattr(task, "reserve", UNSET)
        ):
            return kept[3]
    resolved = options.times(task, settings)
    horizon = resolved.horizon
    reserve = max(resolved.duration("reserve"), TICK).total_seconds()
    source, budget = resolved.resolve("budget")
    delivery = resolved.resolve("delivery_budget")[1]
    stamps_in_seconds = (
        budget is not None and delivery is None and budget.total_seconds() > reserve + EDGE
    )
    found = InSeconds(
        reserve + EDGE,
        horizon.total_seconds() - EDGE,
        horizon,
        settings.get(conf.CLOCK_SKEW_BUDGET) is None,
        budget.total_seconds() if stamps_in_seconds else None,
        source if stamps_in_seconds else None,
        budget is None and delivery is None,
    )
    setattr(task, _IN_SECONDS, (settings, stamp, resolved.attributes, found))
    return found


def admitted_at(task: Any, deadline: float) -> float | None:
    """The claim gate: the clock's reading (epoch seconds) when ``task``'s message with
    the deadline header ``deadline`` (epoch seconds) is clearly in time by this worker's
    clock (within the horizon, and before the last instant the gate admits), for the
    time-limit cap to measure from; ``None``: judge it in full."""
    limits = limits_of(task, settings_for(task.app))
    if not limits.local:
        return None  # a clock-skew budget: the ledger's clock decides
    now = clock.epoch()
    ahead = deadline - now  # NaN or infinity: not clearly anything, judged in full
    return now if limits.low < ahead < limits.high else None


def start(task: Any, request: Any, headers: Any, deadline: float) -> AttemptState | None:
    """The attempt gate of a worker without the ledger, for a message whose deadline
    header is ``deadline`` (epoch seconds): its state when it is clearly in time (the
    clocks' readings kept, the datetimes worked out if the body asks), ``None``: judge
    it in full (and with tracing loaded, which annotates the attempt's span)."""
    if telemetry.observed():
        return None
    limits = limits_of(task, settings_for(task.app))
    now = clock.epoch()
    started = clock.monotonic()  # read together: the budget is anchored at this instant
    ahead = deadline - now  # NaN or infinity: not clearly anything, judged in full
    if limits.low < ahead < limits.high:
        return propagation.begin_in_time(request, headers, deadline, now, started, limits.horizon)
    return None


def stamp_own_budget(task: Any, call: dict[str, Any], task_id: str | None) -> bool | None:
    """The plain cases of a publish without the ledger, stamped into ``call``: one that
    inherits nothing and names nothing of its own (no option of this package's, no
    deadline header) of a task that says no budget anywhere is Celery's own (``False``:
    nothing written); of a task whose budget is longer than its reserve, with no
    delivery budget, and no ``expires``, ``eta`` or ``countdown``, its headers are
    written in epoch seconds, as the full rule would (``True``). ``None``, nothing
    written, for any other publish."""
    if (
        not stamping.CALL_OPTIONS.isdisjoint(call)
        or propagation.inherited() is not stamping.NOTHING
    ):
        return None
    given = call.get("headers")
    if given and not _DEADLINE_HEADERS.isdisjoint(given):
        return None
    limits = limits_of(task, settings_for(task.app))
    if limits.names_nothing:
        return False
    budget = limits.budget
    if budget is None or task.expires is not None or not _MOVES_START.isdisjoint(call):
        return None
    headers = dict(given) if given else {}
    headers[wire.DEADLINE_HEADER] = clock.epoch() + budget
    headers[wire.SOURCE_HEADER] = limits.budget_source
    if task_id:
        headers[wire.ORIGIN_HEADER] = task_id
    call["headers"] = headers
    return True
