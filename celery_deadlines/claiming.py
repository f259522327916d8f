"""The claim in the ledger, in Celery's terms (the pool process, before the body).

A won claim is an :class:`~celery_deadlines.ledger.attempt.Attempt`. A lost one ends the
delivery without running the body (Celery's ``Ignore``): refused for the deadline, by
the database's clock (the refusal is stored as the task's result); failed for good
when the run lost too many leases; held unstarted as CLOCK_UNCERTAIN when this
worker's clock is beyond the skew budget; otherwise simply not run (a duplicate
delivery, another worker's live lease, an ended run). A delivery of an ended run whose
caller is still waiting tells it the ledger's outcome: the worker that ended the run
died before storing it. A claim that could not reach the ledger for a whole lease hands
a late-acked message back to the broker (``Reject`` with requeue: nothing stored for
the caller, nothing lost).
"""

from __future__ import annotations

import logging
import math
import threading
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, NoReturn

from celery import states as celery_states
from celery.exceptions import Ignore, Reject

from . import ledger, recording
from .clock import get_clock
from .errors import LedgerUnreachable, RunFailed
from .rules import gates
from .rules.records import ClaimRefused, Expired, Held
from .rules.states import Status
from .signals import run_claimed, run_held

if TYPE_CHECKING:
    from .ledger.attempt import Attempt
    from .task import DeadlineTask

logger = logging.getLogger("celery_deadlines")


def claim(
    task: DeadlineTask, task_id: str, deadline: datetime | None, reserve: timedelta
) -> Attempt:
    """Claim the run in the ledger, or end this delivery without running the body."""
    api = ledger.api_for(task.app)
    request = task.request
    try:
        outcome = api.claim_run(
            task.app,
            task_id=task_id,
            retries=int(request.retries or 0),
            hostname=request.hostname,
            ttl=task.lease_duration(),
            reserve=reserve,
            unrecorded=lambda: recording.run_of_request(task, request, deadline),
        )
    except LedgerUnreachable as unreachable:
        _hand_back(task, unreachable)
    if isinstance(outcome, Held):
        _hold(task, task_id, outcome)
    if not isinstance(outcome, ClaimRefused):
        attempt = outcome
        lease = attempt.lease
        if lease.waiting_since is not None:
            run_claimed.send(
                sender=task,
                task_id=task_id,
                task_name=task.name,
                queue_wait=max(lease.database_now - lease.waiting_since, timedelta(0)),
            )
        return attempt
    reason = gates.claim_refusal(outcome.why)  # by the database's clock, as the claim was
    if reason is not None:
        task.refuse_attempt(
            gates.Decision(
                gate=gates.Gate.CLAIM,
                reason=reason,
                deadline=deadline,
                clock_reading=outcome.database_now or get_clock().now(),
                remaining=None,
                detail="refused by the ledger's clock",
            ),
            task_id,
        )
    if outcome.why == ClaimRefused.LOST_LEASES:
        _lost_too_many_leases(task, task_id, deadline)
    if outcome.why == ClaimRefused.TERMINAL:
        answer_a_waiting_caller(
            task, task_id, outcome.database_now or get_clock().now(), wait_for_the_attempt=True
        )
    logger.info(
        "%s[%s]: delivery not run, claim refused (%s); run is %s, token %s, owner %s",
        task.name,
        task_id,
        outcome.why,
        outcome.status or "unrecorded",
        outcome.token,
        outcome.owner or "none",
    )
    raise Ignore(f"claim refused: {outcome.why}")


def _hand_back(task: DeadlineTask, unreachable: LedgerUnreachable) -> NoReturn:
    """The ledger could not be reached to claim: the body does not run. A late-acked
    message goes back to the broker and is delivered again (no result is stored: the
    caller is not told a failure of a run that has not run); an early-acked one is gone,
    and the error is the task's failure, as Celery stores any."""
    if task.acks_late and not task.request.is_eager:
        logger.warning(
            "%s[%s]: %s; the message goes back to the broker",
            task.name,
            unreachable.task_id,
            unreachable,
        )
        raise Reject(str(unreachable), requeue=True) from unreachable
    raise unreachable


#: How long after a run's end the attempt that ended it is given to store its outcome
#: before a later delivery of the run tells the caller instead. Celery stores it a few
#: milliseconds after the ledger's end; a duplicate delivery in between told the caller
#: first, and a caller reading then saw ``RunFailed`` where the attempt was about to
#: store its own exception (the demo's ``PlanRefused``, on a clean-clone CI).
OUTCOME_GRACE = timedelta(seconds=2)
#: Between two looks at the caller's result during that grace.
OUTCOME_POLL = timedelta(milliseconds=50)
#: The most looks one grace holds.
_GRACE_LOOKS = math.ceil(OUTCOME_GRACE / OUTCOME_POLL)


def answer_a_waiting_caller(
    task: DeadlineTask, task_id: str, now: datetime, *, wait_for_the_attempt: bool = False
) -> None:
    """A delivery of a run that has ended: usually a duplicate, but also what comes back
    when the worker that ended the run died after the ledger's commit and before Celery
    stored the outcome (a late-acked message is redelivered). If the caller's result is
    still not an outcome, it is told what the ledger recorded: a failure as
    :class:`~celery_deadlines.errors.RunFailed` (Celery's ``WorkerLostError`` for
    ``worker_lost``), an expiry as the claim gate's
    :class:`~celery_deadlines.errors.DeadlineRefused`. Only the result is stored: the
    message's errbacks and chord are not called, since the ended attempt may still be
    calling them (a duplicate delivery racing its last milliseconds). A success's return
    value is not in the ledger: it is only logged. Nothing here may fail the delivery:
    an error reading or storing is logged, and the ledger stays the record.

    ``wait_for_the_attempt`` (a pool process; never the worker's main process, whose
    event loop must not block): a run that ended less than :data:`OUTCOME_GRACE` ago by
    the database clock (``now``) is left to the attempt that ended it until then, its
    result looked at every :data:`OUTCOME_POLL`."""
    if not task.stores_errors():
        return
    try:
        told = _caller_state(task, task_id)
        if told in celery_states.READY_STATES:
            return
        ended = ledger.api_for(task.app).ended_run(task.app, task_id)
        if ended is None:
            return
        if wait_for_the_attempt and _told_within_grace(task, task_id, ended, now):
            return
        if ended.status == Status.SUCCEEDED:
            if not task.ignores_result():
                logger.warning(
                    "%s[%s]: the run SUCCEEDED but its caller has no result (state %s): "
                    "the worker that ended it died or stalled before storing it, and the "
                    "ledger does not keep return values",
                    task.name,
                    task_id,
                    told,
                )
            return
        error = _ledgers_outcome(task_id, ended, now)
        logger.warning(
            "%s[%s]: the run ended %s (%s) but its caller was not told (the worker that "
            "ended it died or stalled before storing it); stored now: %r",
            task.name,
            task_id,
            ended.status,
            ended.reason,
            error,
        )
        task.backend.mark_as_failure(task_id, error)
    except Exception:  # never the delivery's failure: the ledger has the outcome
        logger.exception("%s[%s]: telling the caller the run's end failed", task.name, task_id)


def _caller_state(task: DeadlineTask, task_id: str) -> str | None:
    """The state of the caller's result, as stored now."""
    state: str | None = task.backend.get_task_meta(task_id, cache=False).get("status")
    return state


def _told_within_grace(task: DeadlineTask, task_id: str, ended: Expired, now: datetime) -> bool:
    """Whether the caller is told before :data:`OUTCOME_GRACE` has passed since the run
    ended (``now`` and ``ended.ended_at``: the database clock), looking every
    :data:`OUTCOME_POLL` (a bounded number of looks: no clock is read in between, and
    never more than the whole grace holds, whatever ``now`` says)."""
    if ended.ended_at is None:
        return False
    looks = math.ceil((ended.ended_at + OUTCOME_GRACE - now) / OUTCOME_POLL)
    for _ in range(min(looks, _GRACE_LOOKS)):  # none if the grace has passed
        _pause(OUTCOME_POLL)
        if _caller_state(task, task_id) in celery_states.READY_STATES:
            return True
    return False


def _pause(span: timedelta) -> None:
    threading.Event().wait(span.total_seconds())


def _ledgers_outcome(task_id: str, ended: Expired, now: datetime) -> Exception:
    """What the caller is told of a run the ledger ended FAILED or EXPIRED."""
    if ended.status == Status.EXPIRED:
        return ended.refusal(
            gates.Gate.CLAIM.value, now, ended.detail or "the run had ended EXPIRED"
        )
    if ended.reason == "worker_lost":
        from billiard.exceptions import WorkerLostError

        return WorkerLostError(ended.detail)
    return RunFailed(task_id, ended.reason, ended.detail)


def _lost_too_many_leases(task: DeadlineTask, task_id: str, deadline: datetime | None) -> NoReturn:
    from billiard.exceptions import WorkerLostError

    api = ledger.api_for(task.app)

    detail = "the run lost its lease too many times (deadlines_max_lost_leases)"
    if api.refuse_run(
        task.app,
        task_id=task_id,
        task_name=task.name,
        retries=int(task.request.retries or 0),
        status=Status.FAILED,
        reason="worker_lost",
        detail=detail,
        deadline=deadline,
        confirm_within=None,
    ):
        task.backend.mark_as_failure(
            task_id,
            WorkerLostError(detail),
            request=task.request,
            store_result=task.stores_errors(),
        )
    raise Ignore(detail)


def _hold(task: DeadlineTask, task_id: str, held: Held) -> NoReturn:
    """This worker's clock is beyond the skew budget: the run was given back as
    CLOCK_UNCERTAIN (not failed, not expired) for a worker whose clock agrees."""
    logger.warning(
        "%s[%s]: not started, held as CLOCK_UNCERTAIN: %s%s",
        task.name,
        task_id,
        held.explain(),
        "" if held.recorded else " (the hold was not recorded; the reconciler settles it)",
    )
    run_held.send(
        sender=task,
        task_id=task_id,
        task_name=task.name,
        reading=held.reading,
        budget=held.budget,
    )
    raise Ignore(f"clock uncertain: {held.explain()}")
