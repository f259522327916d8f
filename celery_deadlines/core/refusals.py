"""Every refusal, reported once and told to its caller.

:func:`report_refusal`: every gate's refusal logged, told to the observability
integration (:mod:`.telemetry`) and sent as :data:`~celery_deadlines.signals.deadline_refused`.

What a caller is told of a delivery a gate refused, in Celery's terms: the typed
:class:`~celery_deadlines.errors.DeadlineRefused` stored as the task's failure, except
where Celery itself would have discarded the message: when the governing deadline is
Celery's own ``expires`` (``x_deadline_source`` ``expires``) and the refusal is for that
deadline, the caller is told what Celery tells of a message whose ``expires`` passed
(state ``REVOKED``, ``TaskRevokedError('expired')``, ``task-revoked`` with
``expired=True``), so that an ``except TaskRevokedError`` written for Celery keeps
catching it. The rule is :func:`~celery_deadlines.rules.outcomes.told_as_celery_expiry`;
the ledger keeps the refusal's own reason either way, and tells the runs it ends itself
the same way (:mod:`celery_deadlines.ledger.telling`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from celery.worker.state import revoked

from .. import signals
from ..errors import DeadlineRefused
from ..rules import outcomes
from ..rules.gates import Decision, Gate, Reason
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


def announce_expiry(request: Any) -> None:
    """Celery's own expiry of a worker request (its main process), announced as
    ``Request.revoked()`` announces it: ``task-revoked``, ``REVOKED`` stored, the
    ``task_revoked`` signal, the id kept among the revoked (as its ``maybe_expire``
    keeps it)."""
    revoked.add(request.id)
    request._announce_revoked(outcomes.CELERY_EXPIRED, False, None, True)


def tell_refusal(
    backend: Any, task_id: str, refusal: DeadlineRefused, *, source: str | None, **store: Any
) -> None:
    """Store a refusal of the run ``task_id`` as its caller's result (``store``: the
    backend's ``request`` and ``store_result``): ``REVOKED`` with
    ``TaskRevokedError('expired')`` when it is told as Celery's expiry (``source``: where
    the message's deadline came from, :func:`~celery_deadlines.rules.stamping.header_source`),
    else the typed refusal as its failure."""
    if outcomes.told_as_celery_expiry(refusal.reason, source):
        backend.mark_as_revoked(task_id, outcomes.CELERY_EXPIRED, **store)
    else:
        backend.mark_as_failure(task_id, refusal, **store)
