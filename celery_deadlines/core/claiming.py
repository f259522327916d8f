"""The claim in the ledger, in Celery's terms (the pool process, before the body).

:func:`claim` takes the delivery as values (:class:`Claim`) and returns an outcome;
the task turns an outcome that does not run the body into Celery's at its edge
(``DeadlineTask.before_start``). A won claim is an
:class:`~celery_deadlines.ledger.attempt.Attempt`. A lost one does not run the body:

* :class:`Refused`: refused for the deadline, by the database's clock: the task refuses
  the attempt (the refusal is stored as the task's result, then ``Ignore``);
* :class:`NotRun`: everything there is to do was done here, the task ends the delivery
  with ``Ignore``: failed for good when the run lost too many leases; held unstarted as
  CLOCK_UNCERTAIN when this worker's clock is beyond the skew budget; refused as
  ``task_mismatch`` when the message names another task than the run of its id (the
  run left as it was, nothing stored under its id); otherwise simply not run (a
  duplicate delivery, another worker's live lease, an ended run). A delivery
  of an ended run whose caller is still waiting tells it the ledger's outcome: the
  worker that ended the run died before storing it;
* :class:`Ended`: an eager run (``apply()``) of a run that has ended: its caller waits
  in this very call, and is told the run's outcome as the body's (the task returns the
  kept value or raises the failure; the body is not run again);
* :class:`Unreachable`: the claim could not reach the ledger for a whole lease: a
  late-acked message goes back to the broker (``Reject`` with requeue: nothing stored
  for the caller, nothing lost); an early-acked one fails with the error.
"""

from __future__ import annotations

import logging
import math
import threading
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from billiard.exceptions import WorkerLostError
from celery import states as celery_states

from .. import ledger
from ..clock import get_clock
from ..errors import DeadlineRefused, LedgerUnreachable
from ..rules import gates, limits
from ..rules.records import ClaimRefused, EndedRun, Held
from ..rules.stamping import header_source
from ..rules.states import Status
from ..signals import run_claimed, run_held
from . import pools, recording, timelimits
from .propagation import headers_of
from .refusals import report_refusal, tell_refusal

if TYPE_CHECKING:
    from ..ledger.attempt import Attempt

logger = logging.getLogger("celery_deadlines")


class ResultPolicy(NamedTuple):
    """Celery's result-storing policy for one delivery: where the caller's result is
    stored, and what Celery stores of it (its errors, its return value)."""

    app: Any
    backend: Any
    task_name: str
    #: Celery's rule: errors are stored unless results are ignored, and then only with
    #: ``store_errors_even_if_ignored``
    stores_errors: bool
    #: whether this delivery's return value is not stored
    ignores_result: bool


def result_policy(task: Any) -> ResultPolicy:
    """The result-storing policy of the delivery ``task`` runs on (its current request),
    as Celery's tracer decides: the request's ``ignore_result``, else the task's."""
    ignore_result = task.request.ignore_result
    if ignore_result is None:
        ignore_result = task.ignore_result
    ignores = bool(ignore_result)
    return ResultPolicy(
        app=task.app,
        backend=task.backend,
        task_name=task.name,
        stores_errors=bool(task.store_errors_even_if_ignored or not ignores),
        ignores_result=ignores,
    )


class Claim(NamedTuple):
    """What the claim of one delivery needs, as values."""

    policy: ResultPolicy
    #: the sender of the signals the claim sends (the task)
    sender: Any
    task_id: str
    #: Celery's request of the delivery: its retries and hostname, the row rebuilt from
    #: it for a message published without the outbox, and the request a failure is
    #: stored with
    request: Any
    #: the deadline the message carries (``None``: none)
    deadline: datetime | None
    #: how long the claim owns the run before it must be renewed (and how long an
    #: unreachable ledger is tried)
    lease: timedelta
    reserve: timedelta
    #: the task's serializer (a rebuilt row's message is encoded with it)
    serializer: str
    #: whether a message the claim cannot make goes back to the broker (late-acked and
    #: not eager)
    requeue: bool


class Refused(NamedTuple):
    """Refused for the deadline by the ledger's clock: the task refuses the attempt."""

    decision: gates.Decision


class NotRun(NamedTuple):
    """The body is not run and nothing is left to do: the task ends with ``Ignore(why)``."""

    why: str


class Unreachable(NamedTuple):
    """The ledger could not be reached to claim: with ``requeue`` the message goes back
    to the broker (``Reject``), otherwise ``error`` is the task's failure."""

    error: LedgerUnreachable
    requeue: bool


class Ended(NamedTuple):
    """An eager call of a run that has ended: what it tells its caller instead of running
    the body again, the run's kept return value or its failure (``error``)."""

    value: Any
    error: Exception | None


#: The outcomes that do not run the body.
NOT_RUN = (Refused, NotRun, Unreachable, Ended)


def claim(delivery: Claim) -> Attempt | Refused | NotRun | Unreachable | Ended:
    """Claim the run in the ledger: the attempt, or how this delivery ends unrun."""
    caller = delivery.policy
    app = caller.app
    request = delivery.request
    task_id = delivery.task_id
    deadline = delivery.deadline
    eager = bool(request.is_eager)
    try:
        outcome = ledger.api_for(app).claim_run(
            app,
            task_id=task_id,
            task_name=caller.task_name,
            retries=int(request.retries or 0),
            hostname=request.hostname,
            ttl=delivery.lease,
            reserve=delivery.reserve,
            unrecorded=lambda: recording.run_of_request(
                app, caller.task_name, delivery.serializer, request, deadline
            ),
            # an eager run is the caller's, inside whatever attempt runs it
            exclusive=not eager and pools.one_attempt_at_a_time(),
            eager=eager,
            # what the worker's main process handed the pool with the job (its claim
            # records it); an eager run is under no time limit
            limits=limits.EAGER if eager else timelimits.handed(request, delivery.sender),
        )
    except LedgerUnreachable as unreachable:
        return _hand_back(delivery, unreachable)
    if isinstance(outcome, Held):
        return _hold(delivery, outcome)
    if not isinstance(outcome, ClaimRefused):
        attempt = outcome
        lease = attempt.lease
        if lease.waiting_since is not None:
            run_claimed.send(
                sender=delivery.sender,
                task_id=task_id,
                task_name=caller.task_name,
                queue_wait=max(lease.database_now - lease.waiting_since, timedelta(0)),
            )
        return attempt
    reason = gates.claim_refusal(outcome.why)  # by the database's clock, as the claim was
    if reason is gates.Reason.TASK_MISMATCH:
        return _foreign(delivery, outcome)
    if reason is not None:
        return Refused(
            gates.Decision(
                gate=gates.Gate.CLAIM,
                reason=reason,
                deadline=deadline,
                clock_reading=outcome.database_now or get_clock().now(),
                remaining=None,
                detail="refused by the ledger's clock",
            )
        )
    if outcome.why == ClaimRefused.LOST_LEASES:
        return _lost_too_many_leases(delivery)
    if outcome.why == ClaimRefused.TERMINAL:
        now = outcome.database_now or get_clock().now()
        if eager:
            told = _tell_an_eager_caller(caller, task_id, now)
            if told is not None:
                return told
        else:
            answer_a_waiting_caller(
                caller,
                task_id,
                now,
                wait_for_the_attempt=True,
                source=header_source(headers_of(request)),
            )
    logger.info(
        "%s[%s]: delivery not run, claim refused (%s); run is %s, token %s, owner %s",
        caller.task_name,
        task_id,
        outcome.why,
        outcome.status or "unrecorded",
        outcome.token,
        outcome.owner or "none",
    )
    return NotRun(f"claim refused: {outcome.why}")


def _foreign(delivery: Claim, refused: ClaimRefused) -> NotRun:
    """A message that names another task than the run of its id: the ledger left the run
    as it was and recorded the refusal in its history. Reported as the claim gate's
    refusal (``task_mismatch``: logged at WARNING, ``deadline_refused`` sent), and
    nothing is stored for the caller: the id's result is the other run's, and storing a
    failure there would tell that run's caller an outcome it never had."""
    decision = gates.task_mismatch(
        delivery.policy.task_name, refused.database_now or get_clock().now(), delivery.deadline
    )
    report_refusal(delivery.sender, delivery.task_id, delivery.policy.task_name, decision)
    return NotRun(f"claim refused: {decision.reason}")


def _hand_back(delivery: Claim, unreachable: LedgerUnreachable) -> Unreachable:
    """The ledger could not be reached to claim: the body does not run. A late-acked
    message goes back to the broker and is delivered again (no result is stored: the
    caller is not told a failure of a run that has not run); an early-acked one is gone,
    and the error is the task's failure, as Celery stores any."""
    if delivery.requeue:
        logger.warning(
            "%s[%s]: %s; the message goes back to the broker",
            delivery.policy.task_name,
            unreachable.task_id,
            unreachable,
        )
    return Unreachable(unreachable, delivery.requeue)


#: How long after a run's end the attempt that ended it is given to store its outcome
#: before a later delivery of the run tells the caller instead: Celery stores it a few
#: milliseconds after the ledger's end, and a caller must be told the attempt's own
#: outcome, never ``RunFailed`` from a duplicate delivery that came in between.
OUTCOME_GRACE = timedelta(seconds=2)
#: Between two looks at the caller's result during that grace.
OUTCOME_POLL = timedelta(milliseconds=50)
#: The most looks one grace holds.
_GRACE_LOOKS = math.ceil(OUTCOME_GRACE / OUTCOME_POLL)


def answer_a_waiting_caller(
    caller: ResultPolicy,
    task_id: str,
    now: datetime,
    *,
    wait_for_the_attempt: bool = False,
    source: str | None = None,
) -> None:
    """A delivery of a run that has ended: usually a duplicate, but also what comes back
    when the worker that ended the run died after the ledger's commit and before Celery
    stored the outcome (a late-acked message is redelivered). If the caller's result is
    still not an outcome, it is told what the ledger recorded: a failure as
    :class:`~celery_deadlines.errors.RunFailed` (Celery's ``WorkerLostError`` for
    ``worker_lost``), an expiry as the claim gate's
    :class:`~celery_deadlines.errors.DeadlineRefused` (or as Celery's own expiry when
    the deadline was the message's ``expires``: ``source``, where the delivery's deadline
    came from; :mod:`celery_deadlines.core.refusals`). Only the result is stored: the
    message's errbacks and chord are not called, since the ended attempt may still be
    calling them (a duplicate delivery racing its last milliseconds). A success is told
    with the return value its completion kept, when one was kept (it is logged
    otherwise). Nothing here may fail the delivery:
    an error reading or storing is logged, and the ledger stays the record.

    ``wait_for_the_attempt`` (a pool process; never the worker's main process, whose
    event loop must not block): a run that ended less than :data:`OUTCOME_GRACE` ago by
    the database clock (``now``) is left to the attempt that ended it until then, its
    result looked at every :data:`OUTCOME_POLL`.

    A message naming another task than the run of its id tells nothing: the caller is
    the run's, and is told by a delivery of the run's own message."""
    if not caller.stores_errors:
        return
    try:
        told = _caller_state(caller, task_id)
        if told in celery_states.READY_STATES:
            return
        ended = ledger.api_for(caller.app).ended_run(caller.app, task_id)
        if ended is None or ended.task_name != caller.task_name:
            return  # not ended, or not this task's run
        if wait_for_the_attempt and _told_within_grace(caller, task_id, ended, now):
            return
        if ended.status == Status.SUCCEEDED:
            if not caller.ignores_result:
                _tell_a_success(caller, task_id, ended, told)
            return
        error = ended.told_as(now, WorkerLostError)
        logger.warning(
            "%s[%s]: the run ended %s (%s) but its caller was not told (the worker that "
            "ended it died or stalled before storing it); stored now: %r",
            caller.task_name,
            task_id,
            ended.status,
            ended.reason,
            error,
        )
        if isinstance(error, DeadlineRefused):
            tell_refusal(caller.backend, task_id, error, source=source)
        else:
            caller.backend.mark_as_failure(task_id, error)
    except Exception:  # never the delivery's failure: the ledger has the outcome
        logger.exception(
            "%s[%s]: telling the caller the run's end failed", caller.task_name, task_id
        )


def _tell_an_eager_caller(caller: ResultPolicy, task_id: str, now: datetime) -> Ended | None:
    """An eager call of a run that has ended (a page reloaded with the same task id,
    another process's call): the outcome the ledger recorded, as the first call's caller
    was told it (``None``: the run is gone, purged meanwhile). A success is its kept
    return value (``None`` when none was kept: an ``ignore_result`` task, or one over
    the limit; the log says so)."""
    api = ledger.api_for(caller.app)
    ended = api.ended_run(caller.app, task_id)
    if ended is None:
        return None
    logger.info(
        "%s[%s]: the run had ended %s; its outcome is told again and nothing runs",
        caller.task_name,
        task_id,
        ended.status,
    )
    if ended.status != Status.SUCCEEDED:
        return Ended(None, ended.told_as(now, WorkerLostError))
    if ended.result is None:
        if not caller.ignores_result:
            logger.warning(
                "%s[%s]: the run SUCCEEDED, and the ledger kept no return value to tell "
                "(one over the limit, or not encodable); told None",
                caller.task_name,
                task_id,
            )
        return Ended(None, None)
    try:
        return Ended(api.read_result(caller.app, ended.result), None)
    except ValueError as unreadable:  # UnreadableMessage: never decoded otherwise
        logger.warning(
            "%s[%s]: the run SUCCEEDED; its kept return value is not read here (%s): told None",
            caller.task_name,
            task_id,
            unreadable,
        )
        return Ended(None, None)


def _tell_a_success(caller: ResultPolicy, task_id: str, ended: EndedRun, told: str | None) -> None:
    """A SUCCEEDED run whose caller has no result: store the return value its completion
    kept (:mod:`celery_deadlines.ledger.results`), or say why none can be told."""
    why = "the ledger kept no return value (an ignore_result task, or one over the limit)"
    if ended.result is not None:
        try:
            value = ledger.api_for(caller.app).read_result(caller.app, ended.result)
        except ValueError as unreadable:  # UnreadableMessage: never decoded otherwise
            why = f"its kept return value is not read here: {unreadable}"
        else:
            logger.warning(
                "%s[%s]: the run SUCCEEDED but its caller had no result (state %s): the "
                "worker that ended it died or stalled before storing it; stored now: the "
                "return value the ledger kept",
                caller.task_name,
                task_id,
                told,
            )
            caller.backend.mark_as_done(task_id, value)
            return
    logger.warning(
        "%s[%s]: the run SUCCEEDED but its caller has no result (state %s): the worker "
        "that ended it died or stalled before storing it, and %s",
        caller.task_name,
        task_id,
        told,
        why,
    )


def _caller_state(caller: ResultPolicy, task_id: str) -> str | None:
    """The state of the caller's result, as stored now."""
    state: str | None = caller.backend.get_task_meta(task_id, cache=False).get("status")
    return state


def _told_within_grace(caller: ResultPolicy, task_id: str, ended: EndedRun, now: datetime) -> bool:
    """Whether the caller is told before :data:`OUTCOME_GRACE` has passed since the run
    ended (``now`` and ``ended.ended_at``: the database clock), looking every
    :data:`OUTCOME_POLL` (a bounded number of looks: no clock is read in between, and
    never more than the whole grace holds, whatever ``now`` says)."""
    if ended.ended_at is None:
        return False
    looks = math.ceil((ended.ended_at + OUTCOME_GRACE - now) / OUTCOME_POLL)
    for _ in range(min(looks, _GRACE_LOOKS)):  # none if the grace has passed
        _pause(OUTCOME_POLL)
        if _caller_state(caller, task_id) in celery_states.READY_STATES:
            return True
    return False


def _pause(span: timedelta) -> None:
    threading.Event().wait(span.total_seconds())


def _lost_too_many_leases(delivery: Claim) -> NotRun:
    """The run lost its lease too many times: it ends FAILED ``worker_lost`` (told to
    the caller as Celery's ``WorkerLostError``, when this delivery's refusal ended it)."""
    caller = delivery.policy
    task_id = delivery.task_id
    detail = "the run lost its lease too many times (deadlines_max_lost_leases)"
    if ledger.api_for(caller.app).refuse_run(
        caller.app,
        task_id=task_id,
        task_name=caller.task_name,
        retries=int(delivery.request.retries or 0),
        status=Status.FAILED,
        reason="worker_lost",
        detail=detail,
        deadline=delivery.deadline,
        confirm_within=None,
    ):
        caller.backend.mark_as_failure(
            task_id,
            WorkerLostError(detail),
            request=delivery.request,
            store_result=caller.stores_errors,
        )
    return NotRun(detail)


def _hold(delivery: Claim, held: Held) -> NotRun:
    """This worker's clock is beyond the skew budget: the run was given back as
    CLOCK_UNCERTAIN (not failed, not expired) for a worker whose clock agrees."""
    task_name = delivery.policy.task_name
    logger.warning(
        "%s[%s]: not started, held as CLOCK_UNCERTAIN: %s%s",
        task_name,
        delivery.task_id,
        held.explain(),
        "" if held.recorded else " (the hold was not recorded; the reconciler settles it)",
    )
    run_held.send(
        sender=delivery.sender,
        task_id=delivery.task_id,
        task_name=task_name,
        reading=held.reading,
        budget=held.budget,
    )
    return NotRun(f"clock uncertain: {held.explain()}")
