"""The operations that settle an effect or move a run outside an attempt: one copy each.

The worker's reconciler and the operator (the admin) call the same functions, so that
whoever settles an effect or ends a run, the ledger, the caller's result, the signal and
the log line are the same. Each write is a compare-and-swap on the state it was decided
from: two reconcilers, or a reconciler and an operator, may act on one effect or run at
once; one wins, the other changes nothing and says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..errors import PerformedPastDeadline, RunFailed
from ..rules import outcomes
from ..rules.gates import Gate
from ..rules.states import Status
from ..signals import report_operator_needed, run_cancelled, run_expired
from . import celery_report, outbox
from .sql.connection import Store
from .sql.effects import Pending, Released
from .sql.rows import EndedRun, NewRun, Unclaimed

logger = logging.getLogger("celery_deadlines")


@dataclass(frozen=True)
class Settled:
    """What settling one effect did: ``applied`` (or ``detail`` says why not), and the
    status its run was released to (``QUEUED``, ``EXPIRED``) or ``None``, with the
    reason (``deadline_passed``, ``performed_past_deadline``; ``""`` when queued)."""

    applied: bool
    released: str | None = None
    detail: str = ""
    reason: str = ""


def settle_effect(
    app: Any,
    store: Store,
    seen: Pending,
    *,
    found: bool,
    result: Any,
    evidence: Any,
    by: str,
) -> Settled:
    """Record what the provider's records show about the dispatch ``seen``, then release
    its run if nothing else of it is unresolved.

    ``seen`` is the effect as it was read when the question was asked (the reconciler's
    pending list, the operator's form): if it has changed since (another reconciler or
    operator settled it, or a new attempt dispatched it again), nothing is written.
    """
    # the settlement and the run's release commit together: another reconciler never
    # sees the effect settled and the run still UNKNOWN, and releases it first (the
    # operator was then told nothing was released; an integration test on a loaded
    # machine saw it)
    with store.transaction():
        settlement = store.effects.settle(seen, found, result, evidence, by=by)
        written = store.effects.release_resolved(seen.run_id, by=by) if settlement.applied else None
    if not settlement.applied:
        logger.warning("%s[%s]: %s", seen.task_name, seen.task_id, settlement.detail)
        return Settled(False, detail=settlement.detail)
    _announce_release(app, store, seen.run_id, seen.task_id, seen.task_name, written)
    if written is None:
        return Settled(True)
    return Settled(True, written.status, reason=written.reason)


def release_settled(
    app: Any, store: Store, run_id: int, task_id: str, task_name: str
) -> str | None:
    """An UNKNOWN run none of whose effects is unresolved: queued again and republished
    (the next attempt replays or dispatches anew), or, past its deadline, EXPIRED with
    the caller told why. Returns the status written, or ``None`` (another reconciler or
    operator released it, or an effect is still unresolved)."""
    written = store.effects.release_resolved(run_id)
    _announce_release(app, store, run_id, task_id, task_name, written)
    return written.status if written is not None else None


def _announce_release(
    app: Any,
    store: Store,
    run_id: int,
    task_id: str,
    task_name: str,
    written: Released | None,
) -> None:
    """After a release committed: republish a queued run; tell an expired one's caller
    and the operator what it ended with: :class:`~..errors.PerformedPastDeadline` when
    an effect of it was performed, else a ``deadline_passed`` refusal, each at the
    ``release`` gate with the run's deadline."""
    if written is None:
        return
    if written.status == Status.QUEUED:
        republish(app, store, run_id)
        return
    if written.status != Status.EXPIRED:
        return
    expired = EndedRun(
        task_id=task_id,
        task_name=task_name,
        status=Status.EXPIRED,
        reason=written.reason,
        deadline=written.deadline,
        detail=written.detail,
    )
    now = store.database_now()
    announce_expiry(app, task_id, task_name, written.reason, written.detail)
    refusal = expired.refusal(Gate.RELEASE.value, now, written.detail)
    if written.reason == outcomes.PERFORMED_PAST_DEADLINE:
        refusal = PerformedPastDeadline(*refusal.args)
    celery_report.tell_failed(app, store, task_id, task_name, refusal)


def tell_caller_unknown(app: Any, store: Store, run_id: int, task_id: str, error: str) -> None:
    """The caller's result shows the run as UNKNOWN (the Celery state ``UNKNOWN``, naming
    the effects whose outcome is unknown), and so does Flower (``task-unknown``), until
    the settled outcome replaces it (:func:`.celery_report.tell_unknown`)."""
    celery_report.tell_unknown(app, store, run_id, task_id, error)


def ask_for_operator(
    app: Any, store: Store, run_id: int, task_id: str, task_name: str, detail: str
) -> None:
    """The run just ended UNKNOWN here: page a person (ERROR, ``operator_needed``) if an
    effect of it has no reconciler in its task (a task this process does not know has
    none it could call). Called once per run, by whoever wrote UNKNOWN."""
    try:
        names = store.effects.unresolved_names(run_id)
    except Exception:  # the run is UNKNOWN either way; the admin lists it
        logger.exception("reading the unresolved effects of run %s failed", task_id)
        return
    task = app.tasks.get(task_name)
    finder = getattr(task, "effect_reconciler", None)
    alone = outcomes.needing_an_operator(
        names, lambda name: finder is not None and finder(name) is not None
    )
    if alone:
        report_operator_needed(task or task_name, task_id, task_name, alone, detail)


def requeue_run(app: Any, store: Store, run_id: int, *, operator: str) -> bool:
    """Queue a failed, unknown or stuck run again, if its deadline allows, and publish
    its recorded message (the operator's *requeue*). ``False``: it was finished, held by
    a live lease, past its deadline, or waiting for an effect to be resolved."""
    if not store.operator.requeue_now(run_id, operator):
        return False
    return republish(app, store, run_id)


def expire_run(app: Any, store: Store, run_id: int, *, operator: str) -> bool:
    """End an unfinished run at once (the operator's *expire now*); its holder, if any,
    is fenced, and the caller, the log and :data:`~celery_deadlines.signals.run_expired`
    are told as for any expiry. ``False``: it had already ended, or an effect awaits its
    outcome (resolve it first: an expired run's effects are never asked about again)."""
    ended = store.operator.expire_now(run_id, operator)
    if ended is None:
        return False
    expired = EndedRun(
        task_id=ended.task_id,
        task_name=ended.task_name,
        status=Status.EXPIRED,
        reason="expired_by_operator",
        deadline=ended.deadline,
        detail=f"expired by {operator}",
    )
    store_refusal(app, store, expired, store.database_now(), gate=Gate.OPERATOR)
    return True


def cancel_run(
    store: Store, task_id: str, *, reason: str, by: str, at: datetime | None = None
) -> int:
    """Cancel the run of ``task_id`` with everything it started: each unended run's
    deadline pulled in to the database clock's now (``at``, if earlier), in one statement
    whatever the tree's size; each run's history keeps who cancelled it (``by``) and why.
    Queued runs are refused at their claim (or ended by the sweeper) ``cancelled`` and
    their callers told ``REVOKED``; a running attempt learns it at its next renewal.
    Returns how many runs it changed: 0 for a run that had ended (or is not recorded)."""
    detail = outcomes.cancel_detail(by, reason)
    count = store.operator.cancel(task_id, detail, at)
    logger.warning("run %s cancelled with %d run(s) of its tree: %s", task_id, count, detail)
    run_cancelled.send(sender=store, task_id=task_id, runs=count, by=by, reason=reason)
    return count


def record_missed(app: Any, store: Store, run: NewRun, detail: str) -> bool:
    """A scheduled occurrence whose window closed before it was published: recorded
    EXPIRED (``missed_occurrence``), announced, never run late. ``False``: the ledger
    already has a run for it."""
    if not store.sweeps.record_missed(run, detail):
        return False
    announce_expiry(app, run.task_id, run.task_name, "missed_occurrence", detail)
    return True


def republish(app: Any, store: Store, run_id: int, message: Unclaimed | None = None) -> bool:
    """Publish run ``run_id``'s recorded message (``message``, or read now) again:
    ``True`` if it was. A broker or database error leaves it to the sweeper; a message
    no worker would decode (:class:`~.outbox.UnreadableMessage`) ends the run ``FAILED``
    (``message_unreadable``) and tells its caller: published again, it could never run."""
    try:
        message = message or store.sweeps.message_of(run_id)
        if message is None:
            return False
        outbox.republish(app, message)
    except outbox.UnreadableMessage as exc:
        assert message is not None
        detail = f"its recorded message cannot be published again: {exc}"
        if store.sweeps.fail_unreadable(run_id, detail):
            logger.error(
                "%s[%s] FAILED (message_unreadable): %s", message.task_name, message.task_id, detail
            )
            failed = RunFailed(message.task_id, "message_unreadable", detail)
            tell_caller_failed(app, store, message.task_id, message.task_name, failed)
        return False
    except Exception:  # the sweeper publishes it again later; nothing is lost
        logger.exception("republishing run %s failed; the sweeper will try again", run_id)
        return False
    return True


def tell_caller_failed(
    app: Any, store: Store, task_id: str, task_name: str, error: Exception
) -> None:
    """Store ``error`` as the run's failure for the caller waiting on its result, as a
    worker stores one (:func:`.celery_report.tell_failed`: never over a final state)."""
    celery_report.tell_failed(app, store, task_id, task_name, error)


def store_refusal(
    app: Any,
    store: Store,
    expired: EndedRun,
    now: datetime,
    detail: str = "",
    *,
    gate: Gate = Gate.CLAIM,
) -> None:
    """Tell the caller waiting on the result why the run ended (a typed refusal), and
    the operator (a WARNING and :data:`~celery_deadlines.signals.run_expired`): an
    expiry found by the sweeper is never silent."""
    detail = detail or expired.detail or "the deadline passed before any worker claimed the run"
    announce_expiry(app, expired.task_id, expired.task_name, expired.reason, detail)
    refusal = expired.refusal(gate.value, now, detail)
    celery_report.tell_failed(app, store, expired.task_id, expired.task_name, refusal)


def announce_expiry(sender: Any, task_id: str, task_name: str, reason: str, detail: str) -> None:
    """Log and signal a run the ledger ended as EXPIRED on its own (not at a gate)."""
    logger.warning("%s[%s] EXPIRED (%s): %s", task_name, task_id, reason, detail)
    run_expired.send(
        sender=sender, task_id=task_id, task_name=task_name, reason=reason, detail=detail
    )
