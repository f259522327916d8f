"""Starting an attempt: the attempt gate and, with the ledger, the claim (pool process).

``DeadlineTask.before_start`` comes here (:func:`start`): Celery's tracer runs it right
before it calls the task for the body. The budget is anchored on the monotonic clock, the
attempt refused if it can no longer start (its refusal stored as the task's failure,
then ``Ignore``: the body is not run), and, with the ledger, the run claimed
(:mod:`celery_deadlines.core.claiming`): a lost claim, a duplicate delivery, runs
nothing. What the attempt keeps (:class:`~.propagation.AttemptState`) is on its request,
for the body, its children and its retry.

A deadline header as this package writes it (epoch seconds), clearly in time, with no
ledger and no tracing to tell, is admitted in epoch seconds (:func:`start_in_seconds`,
the gate's shortcut, beside it); every other case, the edges included, by
:func:`start_in_full`.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from datetime import timedelta
from functools import partial
from typing import Any, NoReturn

from celery.exceptions import Ignore, Reject

from .. import clock, conf, ledger
from ..clock import get_clock
from ..conf import settings_for
from ..ledger._crashpoints import hit
from ..rules import gates, stamping, wire
from ..rules.budgets import Anchor
from ..rules.quoting import shown
from ..rules.records import ENDED_IT
from . import cancelling, claiming, options, propagation, recording, telemetry
from .propagation import AttemptState
from .refusals import (
    report_refusal,
    report_refused_message,
    tell_refusal,
    told_revoked_or_ignored,
)


class Told(AttemptState):
    """An eager call of a run that had ended (:class:`claiming.Ended`), handed to the
    task's call instead of an attempt: the call tells the run's outcome, the body is
    not run."""

    __slots__ = ("ended",)

    def __init__(self, ended: claiming.Ended) -> None:
        super().__init__(stamping.NOTHING)
        self.ended = ended


def start(task: Any, request: Any, with_ledger: bool) -> AttemptState | None:
    """Anchor the attempt's budget on the monotonic clock, or refuse to start it (and,
    ``with_ledger``, claim the run); ``None`` when there is nothing to keep: no
    deadline, no ledger (what the body's children inherit is then nothing, and
    nothing is read but the headers: this runs for every message)."""
    headers = request.headers
    if type(headers) is not dict:  # as Celery makes them (checked first: ABCs are slow)
        headers = propagation.headers_of(request)  # whatever the caller gave Celery
    raw = headers.get(wire.DEADLINE_HEADER)
    if not with_ledger:
        if raw is None and wire.DELIVERY_DEADLINE_HEADER not in headers:
            return None  # nothing to gate, nothing to anchor, no claim, no clock read
        if type(raw) is float:
            state = start_in_seconds(task, request, headers, raw)
            if state is not None:
                return state
    return start_in_full(task, request, headers, with_ledger)


def start_in_seconds(task: Any, request: Any, headers: Any, deadline: float) -> AttemptState | None:
    """The attempt gate's shortcut, for a worker without the ledger and a message whose
    deadline header is ``deadline`` (epoch seconds): its state when it is clearly in
    time (the clocks' readings kept, the datetimes worked out if the body asks),
    ``None``: judge it in full (:func:`start_in_full`, which decides the same for every
    message this admits: tests/unit/core/test_fast_paths.py; and with tracing loaded, which
    annotates the attempt's span)."""
    if telemetry.observed():
        return None
    limits = options.in_seconds(task, settings_for(task.app))
    now = clock.epoch()
    started = clock.monotonic()  # read together: the budget is anchored at this instant
    ahead = deadline - now  # NaN or infinity: not clearly anything, judged in full
    if limits.low < ahead < limits.high:
        return propagation.begin_in_time(request, headers, deadline, now, started, limits.horizon)
    return None


def start_in_full(
    task: Any, request: Any, headers: MutableMapping[str, Any], with_ledger: bool
) -> AttemptState:
    """:func:`start` with datetimes, the ledger's claim and tracing."""
    task_id = request.id
    carries = stamping.carries_deadlines(headers)
    if not carries and not with_ledger:
        # the state alone (what the body's children inherit, and its origin)
        return propagation.begin(request, stamping.carried_nothing(headers, task_id))
    installed = get_clock()
    now = installed.now()
    # read together: the budget is anchored at this instant, whatever the claim takes
    started = installed.monotonic()
    settings = settings_for(task.app)
    times = options.times(task, settings)
    carried = stamping.read_headers(headers, now, times.horizon if carries else gates.ZERO, task_id)
    state = propagation.begin(request, carried)
    if carried.unreadable is not None:
        detail = f"unreadable deadline header {shown(carried.unreadable)}"
        refuse_attempt(task, gates.invalid(gates.Gate.ATTEMPT, now, detail), task_id, None)
    deadline = carried.deadline
    if deadline is None and not with_ledger:
        return state  # nothing to gate, nothing to anchor, no claim
    reserve = times.duration("reserve")
    # With a clock-skew budget the ledger's clock decides (docs/explanation/run-ledger.md: the
    # clock-skew hold comes before the deadline): the claim measures this clock
    # against it, holds the run if they disagree, and checks the deadline by the
    # database clock.
    skew_budget = settings.get(conf.CLOCK_SKEW_BUDGET) if with_ledger else None
    if deadline is not None and skew_budget is None and now > gates.latest_start(deadline, reserve):
        refuse_attempt(
            task, gates.admit(gates.Gate.ATTEMPT, deadline, now, reserve), task_id, reserve
        )
    if with_ledger:
        hit("claim.before", task_id)
        attempt = claiming.claim(
            claiming.Claim(
                policy=claiming.result_policy(task),
                sender=task,
                task_id=task_id,
                request=request,
                deadline=deadline,
                lease=task.lease_duration(),
                reserve=reserve,
                serializer=task.serializer,
                requeue=bool(task.acks_late and not request.is_eager),
            )
        )
        if isinstance(attempt, claiming.NOT_RUN):
            if isinstance(attempt, claiming.Ended):
                return Told(attempt)
            end_unclaimed(task, attempt, task_id, reserve)
        hit("claim.after", task_id)
        state.attempt = attempt
        if attempt.lease.deadline is not None and (
            deadline is None or attempt.lease.deadline < deadline
        ):
            # the ledger's deadline is the authority; a header can only shorten it
            deadline = attempt.lease.deadline
            state.carried = carried._replace(deadline=deadline)
        if skew_budget is not None and attempt.reading is not None:
            now = attempt.reading.corrected(now)  # remaining time by the ledger's clock
        attempt.start()
    if deadline is not None:
        state.anchor = Anchor.at(deadline, now, started)
        if state.attempt is not None:
            state.attempt.deadline_at = state.anchor.deadline_monotonic()
            # a cancel learnt at a renewal pulls the attempt's deadline in (and
            # terminates the body of a task that declares cancel_terminates)
            state.attempt.termination = cancelling.termination_for(task, request)
            state.attempt.pulled_in = partial(cancelling.learnt, state)
    telemetry.annotate_attempt(
        deadline=deadline,
        now=now,
        headers=headers,
        lease_token=state.attempt.lease.token if state.attempt is not None else None,
    )
    return state


def end_unclaimed(
    task: Any,
    not_run: claiming.Refused | claiming.NotRun | claiming.Unreachable,
    task_id: str,
    reserve: timedelta,
) -> NoReturn:
    """End a delivery the claim did not run, as its outcome says, in Celery's terms."""
    if isinstance(not_run, claiming.Refused):
        refuse_attempt(task, not_run.decision, task_id, reserve)
    if isinstance(not_run, claiming.Unreachable):
        if not_run.requeue:
            raise Reject(str(not_run.error), requeue=True) from not_run.error
        raise not_run.error
    raise Ignore(not_run.why)


def refuse_attempt(
    task: Any, decision: gates.Decision, task_id: str, reserve: timedelta | None
) -> NoReturn:
    """Refuse to run this delivery: record it, store the typed refusal as the task's
    failure, or Celery's own expiry (:mod:`celery_deadlines.core.refusals`), unless another
    attempt's result stands, and end it with ``Ignore`` (``reserve``: the task's,
    given with a refusal for the deadline). An eager run's caller waits in this very
    call: the refusal is raised, and Celery raises it to the caller or keeps it in
    the ``EagerResult`` as any eager failure."""
    decision = task._kind_of(decision)
    refusal = decision.refusal()
    request = task.request
    eager = bool(request.is_eager)
    outcome = ENDED_IT  # without the ledger every refusal ends its run
    if ledger.enabled_for(task.app):
        try:
            outcome = recording.record_refusal(
                task.app,
                decision,
                task_name=task.name,
                task_id=task_id,
                retries=int(request.retries or 0),
                reserve=reserve,
            )
        except Exception:
            report_refusal(task, task_id, task.name, decision)
            raise
    # recorded first: a late delivery of a run that had ended is not its refusal again
    report_refused_message(task, task.app, task_id, task.name, decision, outcome)
    if not outcome:
        # already ended, or another attempt owns the run: its result stands
        if eager:
            raise refusal
        raise Ignore(str(refusal))
    if eager:
        raise refusal
    source = stamping.header_source(propagation.headers_of(request))
    tell_refusal(
        task.backend,
        task_id,
        refusal,
        source=source,
        request=request,
        store_result=claiming.result_policy(task).stores_errors,
    )
    raise told_revoked_or_ignored(refusal, source)
