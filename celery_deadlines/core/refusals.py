"""Every gate's refusal reported once: logged, told to the observability integration, and
sent as :data:`~celery_deadlines.signals.deadline_refused`."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .. import signals
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
