"""Every refusal, reported once and told to its caller.

:func:`report_refusal`: every gate's refusal logged, told to the observability
integration (:mod:`.telemetry`) and sent as :data:`~celery_deadlines.signals.deadline_refused`;
a message's refusal at the claim or attempt gate is reported by what it did to its run
(:func:`report_refused_message`: a late or duplicate delivery, or this worker's clock
running ahead, is not the run's refusal again).

What a caller is told of a delivery a gate refused, in Celery's terms: the typed
:class:`~celery_deadlines.errors.DeadlineRefused` stored as the task's failure, except
where Celery itself would have discarded the message: when the governing deadline is
Celery's own ``expires`` (``x_deadline_source`` ``expires``) and the refusal is for that
deadline, the caller is told what Celery tells of a message whose ``expires`` passed
(state ``REVOKED``, ``TaskRevokedError('expired')``, ``task-revoked`` with
``expired=True``), so that an ``except TaskRevokedError`` written for Celery keeps
catching it. The rule is :func:`~celery_deadlines.rules.outcomes.told_as_celery_expiry`;
the ledger keeps the refusal's own reason either way, and tells the runs it ends itself
the same way (:mod:`celery_deadlines.ledger.celery_report`).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final

from celery.exceptions import Ignore
from celery.signals import task_revoked
from celery.worker.state import revoked

from .. import conf, signals
from ..conf import settings_for
from ..errors import DeadlineRefused
from ..rules import gates, outcomes
from ..rules.gates import Decision, Gate, Reason
from ..rules.records import Refusal
from . import telemetry

logger = logging.getLogger("celery_deadlines")


#: What a refusal's log line says in place of a task id it has none of, by gate.
_UNNAMED = {Gate.OUTBOUND: "no task", Gate.CLAIM: "no task id"}


def report_refusal(
    sender: object,
    task_id: str | None,
    task_name: str,
    decision: Decision,
    *,
    carrier: Mapping[str, Any] | None = None,
) -> None:
    """Log a refusal, tell it to the observability integration (:mod:`.telemetry`;
    ``carrier``: the message's headers, where no span is current) and send
    :data:`~celery_deadlines.signals.deadline_refused`."""
    # a refused publish has no id yet; a call refused outside any task has no task; a
    # message refused at the claim gate may carry an id that is not a task id
    unnamed = _UNNAMED.get(decision.gate, "not published")
    logger.warning(
        "%s[%s] refused at %s gate: %s; deadline %s, clock read %s%s",
        task_name,
        task_id or unnamed,
        decision.gate,
        decision.reason,
        _deadline_said(decision),
        decision.clock_reading.isoformat(),
        f"; {decision.detail}" if decision.detail else "",
    )
    telemetry.record_refusal(decision, task_name=task_name, task_id=task_id, carrier=carrier)
    signals.deadline_refused.send(
        sender=sender, task_id=task_id, task_name=task_name, decision=decision
    )


def _deadline_said(decision: Decision) -> str:
    """The refused message's deadline in the log line: ``unreadable`` only for a header
    that could not be read, ``not read`` for a message refused before it was judged (a
    refusal for something else may have no deadline at all)."""
    if decision.deadline is not None:
        return decision.deadline.isoformat()
    if decision.reason is Reason.INVALID_DEADLINE:
        return "unreadable"
    return "not read" if decision.reason is Reason.INVALID_MESSAGE else "none"


#: The runs whose refusal a worker's clock running ahead of the ledger's was reported for
#: at ERROR, most recent last (at most :data:`_TOLD_AT_MOST`: a bounded memory).
_clock_ahead_told: OrderedDict[str, None] = OrderedDict()
_TOLD_AT_MOST: Final = 1024
_told_lock = threading.Lock()


def report_refused_message(
    sender: Any,
    app: Any,
    task_id: str | None,
    task_name: str,
    decision: gates.Decision,
    outcome: Refusal,
    *,
    carrier: Mapping[str, Any] | None = None,
) -> None:
    """Report a gate's refusal of a message by what it did to the run (``outcome``, from
    :func:`record_refusal`; :data:`ENDED_IT` without the ledger): a refusal that ended
    the run, or a message naming another task's run, is the run's one refusal (logged
    at WARNING, ``deadline_refused`` sent: :func:`report_refusal`). A message of a run
    that had ended, or that another attempt runs, is a late or duplicate delivery,
    logged at INFO: its run was told and counted once already. A refusal for the
    deadline that the ledger's clock does not confirm is this worker's clock running
    ahead: logged at ERROR once per run (at INFO after), with what to do about it."""
    kind = outcome.outcome
    if kind in (Refusal.ENDED, Refusal.TASK_MISMATCH):
        report_refusal(sender, task_id, task_name, decision, carrier=carrier)
        return
    gate = decision.gate
    if kind == Refusal.ALREADY_ENDED:
        logger.info(
            "%s[%s]: message discarded at %s gate: the run had already ended %s (%s)",
            task_name,
            task_id,
            gate,
            outcome.status,
            outcome.reason or "-",
        )
    elif kind == Refusal.OWNED:
        logger.info(
            "%s[%s]: message discarded at %s gate (%s): another attempt is running the run (%s)",
            task_name,
            task_id,
            gate,
            decision.reason,
            outcome.owner,
        )
    elif kind == Refusal.NOT_CONFIRMED and task_id is not None:
        _tell_clock_ahead(app, task_id, task_name, decision, outcome)
    else:
        logger.info(
            "%s[%s]: message discarded at %s gate (%s); the run is %s, left to the ledger",
            task_name,
            task_id,
            gate,
            decision.reason,
            outcome.status or "not recorded",
        )


def _tell_clock_ahead(
    app: Any, task_id: str, task_name: str, decision: gates.Decision, outcome: Refusal
) -> None:
    """This worker refused a message for its deadline by its own clock, and the ledger's
    clock says the run is still in time: the message is gone, the run stays as it was,
    and the sweeper publishes it again after ``deadlines_republish_after``."""
    now = outcome.database_now
    deadline = outcome.deadline
    ahead = None if now is None else (decision.clock_reading - now).total_seconds()
    left = None if now is None or deadline is None else (deadline - now).total_seconds()
    with _told_lock:
        first = task_id not in _clock_ahead_told
        _clock_ahead_told[task_id] = None
        _clock_ahead_told.move_to_end(task_id)
        while len(_clock_ahead_told) > _TOLD_AT_MOST:
            _clock_ahead_told.popitem(last=False)
    if not first:
        logger.info(
            "%s[%s]: message discarded at %s gate (%s) by this worker's clock, again: the "
            "ledger's clock says the run is in time (its clock runs %s s ahead)",
            task_name,
            task_id,
            decision.gate,
            decision.reason,
            "?" if ahead is None else f"{ahead:.3f}",
        )
        return
    republish = settings_for(app).get(conf.REPUBLISH_AFTER)
    logger.error(
        "%s[%s]: this worker's clock runs %s s ahead of the ledger's: it refused the "
        "message at %s gate (%s, clock read %s), but by the database clock the run has "
        "%s s left before its deadline %s, so the ledger did not end it. The message is "
        "dropped; the run stays %s and the ledger publishes it again after "
        "deadlines_republish_after (%s s), for a worker whose clock agrees. Correct this "
        "worker's clock (NTP), or set deadlines_clock_skew_budget: a worker then "
        "measures its clock against the ledger's and takes no work while they disagree.",
        task_name,
        task_id,
        "?" if ahead is None else f"{ahead:.3f}",
        decision.gate,
        decision.reason,
        decision.clock_reading.isoformat(),
        "?" if left is None else f"{left:.3f}",
        "none" if deadline is None else deadline.isoformat(),
        outcome.status or "queued",
        republish.total_seconds() if isinstance(republish, timedelta) else republish,
        extra={"celery_deadlines.task_id": task_id, "celery_deadlines.task_name": task_name},
    )


def announce_expiry(request: Any, why: str = outcomes.CELERY_EXPIRED) -> None:
    """Celery's own expiry of a worker request (its main process), announced as
    ``Request.revoked()`` announces it: ``task-revoked``, ``REVOKED`` stored, the
    ``task_revoked`` signal, the id kept among the revoked (as its ``maybe_expire``
    keeps it). ``why``: ``revoked`` for a cancelled run (Celery's revoke, not expired)."""
    revoked.add(request.id)
    request._announce_revoked(why, False, None, why == outcomes.CELERY_EXPIRED)


def tell_refusal(
    backend: Any, task_id: str, refusal: DeadlineRefused, *, source: str | None, **store: Any
) -> None:
    """Store a refusal of the run ``task_id`` as its caller's result (``store``: the
    backend's ``request`` and ``store_result``): ``REVOKED`` with
    ``TaskRevokedError('revoked')`` for a cancelled run, ``TaskRevokedError('expired')``
    when it is told as Celery's expiry (``source``: where
    the message's deadline came from, :func:`~celery_deadlines.rules.stamping.header_source`),
    else the typed refusal as its failure."""
    revoked_as = outcomes.celery_revocation(refusal.reason, source)
    if revoked_as is not None:
        backend.mark_as_revoked(task_id, revoked_as, **store)
    else:
        backend.mark_as_failure(task_id, refusal, **store)


class ToldRevoked(Ignore):
    """A delivery its pool process ended as Celery ends a revoked one: its caller was told
    ``REVOKED`` (a cancelled run refused at its claim or ended after its body, or a
    refusal for a deadline that was the message's ``expires``). ``args``: Celery's reason
    (``revoked`` or ``expired``), the refusal's text, and whether the body was terminated
    (a cancel's ``cancel_terminates``). The worker's main process announces it
    (:func:`announce_told_revoked`)."""

    @property
    def why(self) -> str:
        return str(self.args[0])

    @property
    def terminated(self) -> bool:
        return len(self.args) > 2 and bool(self.args[2])


def told_revoked_or_ignored(refusal: DeadlineRefused, source: str | None) -> ToldRevoked | Ignore:
    """What ends a pool process's delivery whose refusal :func:`tell_refusal` stored:
    :class:`ToldRevoked` when its caller was told ``REVOKED``, else ``Ignore``."""
    revoked_as = outcomes.celery_revocation(refusal.reason, source)
    if revoked_as is not None:
        return ToldRevoked(revoked_as, str(refusal))
    return Ignore(str(refusal))


def announce_told_revoked(request: Any, told: ToldRevoked) -> None:
    """A delivery its pool process ended :class:`ToldRevoked`, announced in the worker's
    main process as Celery announces a revoked one (``Request._announce_revoked``, but
    for the result, stored already): ``task-revoked``, so that Flower shows ``REVOKED``
    and not ``STARTED`` for ever, and the ``task_revoked`` signal."""
    expired, terminated = told.why == outcomes.CELERY_EXPIRED, told.terminated
    request.send_event("task-revoked", terminated=terminated, signum=None, expired=expired)
    task_revoked.send(
        request.task,
        request=request._context,
        terminated=terminated,
        signum=None,
        expired=expired,
    )
