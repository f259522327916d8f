"""Finishing an attempt: the body run, and its outcome written under the claim's token.

``DeadlineTask.__call__`` comes here (:func:`run_body`) with what ``before_start``
handed over (:data:`~.propagation.HANDED`): the body runs with its queries capped by
the deadline (:mod:`celery_deadlines.core.database`), and, with the ledger, the run's
end is written under the claim's fencing token (:func:`end_after_body` for a body that
raised). A stale attempt's refused write (:class:`StaleLease`) becomes ``Ignore``: it
must not store a result over the current owner's.
"""

from __future__ import annotations

import logging
from traceback import format_exception
from typing import TYPE_CHECKING, Any, NoReturn

from celery.exceptions import Ignore, Reject, Retry

from .. import ledger
from ..errors import DeadlineRefused, StaleLease
from ..ledger._crashpoints import hit
from ..rules import gates, outcomes
from ..rules.budgets import Anchor
from ..rules.records import EndedRun
from ..rules.states import Status
from . import cancelling, pools
from .body import Paused, Unresolved, end_unresolved
from .propagation import AttemptState
from .refusals import ToldRevoked
from .starting import Told

if TYPE_CHECKING:
    from ..ledger.attempt import Attempt

logger = logging.getLogger("celery_deadlines")


class EndedCancelled(ToldRevoked):
    """A cancelled run's attempt, ended ``cancelled`` and its caller told ``REVOKED``:
    Celery's tracer stores nothing more (an ``Ignore``), the worker's main process
    announces it (``task-revoked``)."""


def run_body(task: Any, handed: AttemptState, args: Any, kwargs: Any) -> Any:
    """The body of the attempt ``before_start`` handed over (``handed``), and its outcome
    written under the claim's token. Called by Celery's tracer right after
    ``before_start``, which already pushed the request and the task: the body runs on
    that request, as Celery runs a ``celery.Task``'s (never pushed twice)."""
    attempt = handed.attempt
    if attempt is None:
        if type(handed) is Told:  # an eager call of a run that had ended
            if handed.ended.error is not None:
                raise handed.ended.error
            return handed.ended.value
        from .database import capped  # here: see run_claimed

        with capped(task.app, handed.anchor):
            return task.run(*args, **kwargs)
    return run_claimed(task, attempt, args, kwargs, handed.anchor)


def run_claimed(
    task: Any, attempt: Attempt, args: Any, kwargs: Any, anchor: Anchor | None = None
) -> Any:
    """The body of a claimed attempt, and its outcome written under its token. The
    body's queries end by the deadline (``anchor``'s: :mod:`.database`)."""
    # imported here, where a body runs with a ledger: a module-level import costs the
    # header tier's main process 0.9 % of its instructions per message (bench/README.md)
    from .database import capped

    try:
        try:
            try:
                with capped(task.app, anchor):
                    result = cancelling.terminable(attempt.termination, task.run, *args, **kwargs)
            finally:
                attempt.stop()  # no renewal may follow the attempt's final write
            if attempt.unresolved:
                end_unresolved(attempt, task=task)
            if attempt.cancelled:
                end_cancelled(task, attempt)
            attempt.succeed(result_to_keep(task, result))
            hit("run.completed", task.request.id)
            return result
        except (Retry, StaleLease, Unresolved, Paused, EndedCancelled):
            raise  # written by apply_async / by nobody (stale) / as UNKNOWN / PAUSED
        except BaseException as exc:
            if pools.stopped_by_the_pool(exc):
                raise  # the worker writes the run's end at the limit, as prefork's
            if attempt.cancelled and not attempt.unresolved:
                terminated = isinstance(exc, cancelling.TerminatedByCancel)
                end_cancelled(task, attempt, terminated=terminated)
            end_after_body(attempt, exc, task=task)
            raise
    except StaleLease as exc:
        if task.request.is_eager:
            refusal = end_eager_overrun(attempt, task=task)
            if refusal is not None:
                raise refusal from exc
        logger.warning("%s[%s]: %s; nothing stored", task.name, task.request.id, exc)
        raise Ignore(str(exc)) from exc


def end_cancelled(task: Any, attempt: Attempt, *, terminated: bool = False) -> NoReturn:
    """The end of a body whose run was cancelled while it ran (its renewal found the
    deadline pulled in): ``EXPIRED`` ``cancelled`` whatever the body returned or
    raised, and its caller told Celery's revoke (``REVOKED``), as every run of the
    cancelled tree is. A lease lapsed meanwhile raises :class:`StaleLease`: the
    reconciler ends the run ``cancelled`` then. ``terminated``: the cancel terminated
    the body (its task's ``cancel_terminates``)."""
    detail = "cancelled while it ran: its deadline was pulled in" + (
        "; its body was terminated" if terminated else ""
    )
    attempt.end(Status.EXPIRED, gates.Reason.CANCELLED.value, detail)
    cancelling.announce_ended(task, task.request.id, detail, task.request)
    raise EndedCancelled(outcomes.CELERY_REVOKED, detail, terminated)


def result_to_keep(task: Any, result: Any) -> Any:
    """The return value the ledger keeps with the run's end, so a redelivery after
    a worker died before Celery stored it tells the caller: nothing when Celery
    would store nothing (``ignore_result``)."""
    if task.ignore_result:
        return None
    return ledger.api_for(task.app).keep_result(task.app, result)


def end_after_body(attempt: Attempt, exc: BaseException, *, task: Any = None) -> None:
    """Write the run's outcome for a body that raised ``exc``, as Celery reads ``exc``
    (the caller re-raises it). With an effect dispatched and no outcome known, whatever
    was raised, the run ends UNKNOWN and :class:`~celery_deadlines.core.body.Unresolved` is
    raised instead: never FAILED, never released to run again. A run that fails after
    effects were performed names them in its record and in ``exc``'s notes."""
    if attempt.unresolved:
        end_unresolved(attempt, exc, task=task)
    celery: outcomes.CeleryEnd = None
    if isinstance(exc, Ignore):
        celery = "ignore"
    elif isinstance(exc, Reject):
        celery = "requeue" if getattr(exc, "requeue", False) else "reject"
    outcome = outcomes.after_body(
        exc, celery=celery, unresolved_keys=attempt.unresolved, performed=attempt.performed
    )
    note = outcomes.note_for(outcome, attempt.performed)
    if note is not None:
        # the caller's error says it too: its traceback (any result serializer) and
        # the exception's notes (a pickling backend, an eager run, Sentry)
        exc.add_note(note)
    if outcome.released:
        attempt.release(outcome.detail)
    elif outcome.status == Status.FAILED:
        # the run's page and explain show what Celery's result would (bounded)
        trace = outcomes.bounded_traceback("".join(format_exception(exc)))
        attempt.end(outcome.status, outcome.reason, outcome.detail, trace)
    elif outcome.status is not None:
        attempt.end(outcome.status, outcome.reason, outcome.detail)


def end_eager_overrun(attempt: Attempt, *, task: Any) -> DeadlineRefused | None:
    """The refusal an eager body that ran past its deadline ends with, its run ended
    EXPIRED (UNKNOWN when an effect lacks an outcome): its end was refused, and no
    worker's supervisor or reconciler will end the run, as they end a worker's. ``None``
    when the deadline has not passed by the ledger's clock (the lease was lost otherwise)
    or the run is not this attempt's any more: nothing is changed then."""
    deadline = attempt.lease.deadline
    now = attempt.database_now()
    if deadline is None or now < deadline:
        return None
    reason = gates.expiry_reason(delivery_task=getattr(task, "deadline_kind", None) == "delivery")
    detail = "the eager body ran past its deadline"
    written = attempt.end_overrun(Status.EXPIRED, reason.value, detail)
    if written != Status.EXPIRED:
        return None
    ended = EndedRun(attempt.lease.task_id, task.name, written, reason.value, deadline, detail)
    return ended.refusal(gates.Gate.ATTEMPT.value, now, detail)
