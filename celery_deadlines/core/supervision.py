"""A request's supervision, in the worker's main process: what the ledger is told when
a pool process hit its hard time limit or died, and how the message is then ended.

``DeadlineRequest.on_timeout`` and ``on_failure`` (Celery's hooks, called by the
supervisor of the pool) come here. With the ledger, the run's end is written once
(:func:`time_limit_outcome`: EXPIRED at the deadline's cap, FAILED ``time_limit`` at the
task's own, UNKNOWN with an effect of unknown outcome), a lost pool process's lease is
given up to the reconciler (:func:`lost_to_the_ledger`), and a caller is never told a
failure Celery would store for a run whose outcome is still to come.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from billiard.einfo import ExceptionWithTraceback  # type: ignore[attr-defined]
from billiard.exceptions import TimeLimitExceeded, WorkerLostError
from celery.worker.state import task_ready

from .. import ledger
from ..clock import get_clock
from ..rules import outcomes
from ..rules.gates import Reason
from ..rules.states import UNKNOWN_EVENT, Status
from . import cancelling, pools
from .body import AttemptAPI, Unresolved
from .claiming import result_policy
from .refusals import ToldRevoked, announce_told_revoked

logger = logging.getLogger("celery_deadlines")

#: a hard time limit's outcome not decided yet (``DeadlineRequest._time_limit_written``)
UNDECIDED: Final = object()


def failed(request: Any, exc_info: Any) -> bool:
    """``on_failure``: whether the failure in ``exc_info`` was handled here (the ledger
    settles the run and the message was ended: Celery's own handling must not follow),
    else ``False``: Celery handles it as usual."""
    exc = getattr(exc_info, "exception", None)
    if isinstance(exc, ExceptionWithTraceback):  # as Celery unwraps it
        exc = exc.exc
    # billiard reports a hard time limit here first, then calls on_timeout
    if isinstance(exc, TimeLimitExceeded) and exc.args:
        return settled_here(time_limit_outcome(request, exc.args[0]))
    if isinstance(exc, WorkerLostError):
        return lost_to_the_ledger(request, exc)
    if isinstance(exc, Unresolved):
        # Celery only acknowledges an Ignore: Flower would show STARTED for ever
        request.send_event(UNKNOWN_EVENT, effects=exc.keys, detail=str(exc.args[0]))
    elif isinstance(exc, ToldRevoked):
        announce_told_revoked(request, exc)  # Celery only acknowledges an Ignore
    return False


#: A hard time limit's outcome when a cancel had pulled it in (:func:`time_limit_outcome`):
#: the run ended ``EXPIRED cancelled`` and its caller was told ``REVOKED`` here.
TOLD_REVOKED: Final = "REVOKED"


def settled_here(outcome: str | None) -> bool:
    """Whether a hard time limit's ``outcome`` was told its caller here, so that Celery's
    own ``TimeLimitExceeded`` must not follow: an effect's unknown outcome, a cancel."""
    return outcome in (Status.UNKNOWN, TOLD_REVOKED)


def _with_ledger(request: Any) -> bool:
    return isinstance(request.task, AttemptAPI) and ledger.enabled_for(request.task.app)


def time_limit_outcome(request: Any, timeout: float) -> str | None:
    """The run's end after a hard time limit, written once in the ledger (whichever of
    Celery's two hooks comes first): EXPIRED when the limit was the deadline's cap
    (the attempt gate), FAILED ``time_limit`` when it was the task's own, UNKNOWN
    when an effect's outcome is unknown. UNKNOWN is what the caller is told then, and
    nothing else: Celery's ``TimeLimitExceeded`` would be a failure a waiting
    ``get()`` raises for a run whose outcome is not known yet. A limit a cancel pulled
    in (:func:`~.cancelling.hard_limits_fall`) ends the run EXPIRED ``cancelled``, its
    caller told ``REVOKED`` as every run of a cancelled tree is (:data:`TOLD_REVOKED`)."""
    if request._time_limit_written is not UNDECIDED:
        decided: str | None = request._time_limit_written
        return decided
    written: str | None = None
    request._time_limit_written = written
    if not _with_ledger(request):
        return None
    # judged by the ledger's clock when a skew budget is set: a wall clock stepped
    # back must not make the deadline's cap the task's own time limit
    local = get_clock().now()
    deadline = request._carried(local).deadline
    now = request._judging_now(local) or local
    if request._capped_by_deadline and deadline is not None:
        # the limit that fired was the deadline's cap: a clock read a little early
        # (or stepped back) does not make it the task's own (a run killed at its
        # deadline is EXPIRED, never FAILED time_limit)
        now = max(now, deadline)
    status, reason = outcomes.after_time_limit(
        deadline,
        now,
        delivery_task=getattr(request.task, "deadline_kind", None) == "delivery",
    )
    detail = f"hard time limit ({timeout} s) exceeded"
    cancelled = getattr(request, cancelling.FELL, False)
    if cancelled:
        status, reason = Status.EXPIRED, Reason.CANCELLED.value
        detail = (
            "cancelled while it ran: its body had not returned one lease after the "
            "cancel, when its hard time limit fell"
        )
    api = ledger.api_for(request.task.app)
    try:
        written = api.end_owned(
            request.task.app,
            task_id=request.id,
            hostname=request.hostname,
            pid=pools.owner_pid(request.worker_pid),  # the owner its claim named
            status=status,
            reason=reason,
            detail=detail,
        )
    except Exception:  # the reconciler settles the lapsed lease instead
        logger.exception("recording the time limit of %s in the ledger failed", request.id)
    if cancelled and written == Status.EXPIRED:
        written = TOLD_REVOKED
        _tell_revoked(request, detail)
    request._time_limit_written = written
    if written == Status.UNKNOWN:
        # a WARNING: the ERROR that pages a person comes from tell_caller_unknown,
        # only when no reconciler of the task can settle the effect
        logger.warning(
            "Hard time limit (%s s) exceeded for %s[%s]: an effect's outcome is "
            "unknown; the run ledger reconciles it",
            timeout,
            request.name,
            request.id,
        )
        task_ready(request)
        try:
            api.tell_caller_unknown(request.task.app, request.id, detail, request.name)
        except Exception:
            logger.exception("storing the UNKNOWN state of %s failed", request.id)
        # as Celery handles a timed-out message (the setting is not in the stubs)
        _end_message(request, requeue=not getattr(request.task, "acks_on_timeout", True))
    return written


def _tell_revoked(request: Any, detail: str) -> None:
    """A cancelled run whose body its fallen hard limit ended: logged and signalled as
    a cancelled run's end, its caller told ``REVOKED`` and ``task-revoked`` sent
    (``terminated``), and the message ended as a refused one is (never redelivered)."""
    task_ready(request)
    cancelling.announce_ended(request.task, request.id, detail, request._context)
    announce_told_revoked(request, ToldRevoked(outcomes.CELERY_REVOKED, detail, True))
    _end_message(request, requeue=False)


def lost_to_the_ledger(request: Any, exc: BaseException) -> bool:
    """A lost pool process held the run's lease: the reconciler settles the run
    (queued again, UNKNOWN, EXPIRED, or FAILED after too many lost leases) and tells
    the caller. ``True`` then: Celery would store ``WorkerLostError`` now, a failure
    a waiting ``get()`` raises for a run that may still succeed; nothing is stored,
    and the message is handled as Celery handles it."""
    if not _with_ledger(request):
        return False
    try:
        settled_by_ledger = ledger.api_for(request.task.app).lapse_owned(
            request.task.app,
            request.id,
            request.hostname,
            pools.owner_pid(request.worker_pid),
            repr(exc),
        )
    except Exception:  # the lease lapses on its own; the reconciler settles it
        logger.exception("recording the loss of %s in the ledger failed", request.id)
        return False
    if not settled_by_ledger:
        return _lost_after_its_success(request, exc)
    task_ready(request)
    logger.warning(
        "%s[%s]: pool process lost (%r); the run ledger settles the run",
        request.name,
        request.id,
        exc,
    )
    # as Celery handles a lost worker's message (the claim takes one delivery)
    _end_message(
        request,
        requeue=bool(request.task.reject_on_worker_lost),
        ack=getattr(request.task, "acks_on_failure", True),  # not in the stubs
    )
    return True


def _lost_after_its_success(request: Any, exc: BaseException) -> bool:
    """The pool process died after the ledger recorded SUCCEEDED: Celery would store
    ``WorkerLostError`` over a success (over a ``SUCCESS`` already stored, too). The
    result already stored stays; else the return value the completion kept is
    stored. ``False`` (Celery's own handling) when the run did not succeed, or no
    value was kept and none stored."""
    task = request.task
    try:
        ended = ledger.api_for(task.app).ended_run(task.app, request.id)
        if ended is None or ended.status != Status.SUCCEEDED or ended.task_name != task.name:
            return False  # (another task's run under this id is not this message's)
        stored = task.backend.get_task_meta(request.id, cache=False).get("status")
        if stored != "SUCCESS":
            if ended.result is None or result_policy(task).ignores_result:
                return False
            value = ledger.api_for(task.app).read_result(task.app, ended.result)
            task.backend.mark_as_done(request.id, value, request=request._context)
    except Exception:  # Celery's own handling: the ledger still says SUCCEEDED
        logger.exception("telling the success of %s after its pool process died", request.id)
        return False
    task_ready(request)
    logger.warning(
        "%s[%s]: pool process lost (%r) after the run SUCCEEDED; its result is %s",
        request.name,
        request.id,
        exc,
        "the one already stored" if stored == "SUCCESS" else "the value the ledger kept",
    )
    _end_message(request, requeue=False)  # done: never delivered again
    return True


def _end_message(request: Any, *, requeue: bool, ack: bool = True) -> None:
    """A late-acked message whose run the ledger settles: requeued, acknowledged or
    rejected, as Celery's own ``on_failure``/``on_timeout`` would (an early-acked
    one is gone already)."""
    if not request.task.acks_late:
        return
    if requeue:
        request.reject(requeue=True)
    elif ack:
        request.acknowledge()
    else:
        request.reject(requeue=False)
