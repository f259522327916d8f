"""The library's signals: every refusal, a run the ledger ends on its own, a claim, the
clock's readings, a plan resumed, a run that needs an operator.

Every refusal is logged (logger ``celery_deadlines``, WARNING) *and* sent as a signal,
so applications can count, alert or persist refusals without parsing logs::

    from celery_deadlines import deadline_refused

    @deadline_refused.connect
    def count(sender, task_id, task_name, decision, **kwargs):
        metrics.increment(f"refused.{decision.gate}.{decision.reason}")

``sender`` is the task (or the task name, for ``send_task``); ``decision`` is the
:class:`celery_deadlines.rules.gates.Decision`. Receivers run synchronously in the process
that refused (the caller for enqueue, the worker for claim, attempt and retry); an
exception in a receiver is logged by Celery and never changes the decision.
"""

from __future__ import annotations

import logging

from celery.utils.dispatch import Signal

logger = logging.getLogger("celery_deadlines")

#: A gate refused: the body does not run, or a call is not published or not sent.
#: ``decision`` says which gate (``decision.gate``), why (``decision.reason``), the
#: deadline and the clock reading; ``sender`` is the task, or the task's name for
#: ``send_task``.
deadline_refused = Signal(
    name="deadline_refused",
    providing_args=["task_id", "task_name", "decision"],
)

#: A worker's clock left ``deadlines_clock_skew_budget`` (or the ledger's clock could not
#: be read): it takes no new work. ``reading`` is the ClockReading (``None``: unreadable).
clock_uncertain = Signal(name="clock_uncertain", providing_args=["reading", "budget"])
#: ... and is back within it: the worker consumes again.
clock_certain = Signal(name="clock_certain", providing_args=["reading", "budget"])
#: A worker measured its clock against the ledger's (every reconcile pass, with a skew
#: budget set): ``reading`` is the ClockReading, ``None`` when it could not be read.
clock_measured = Signal(name="clock_measured", providing_args=["reading"])
#: A run was claimed by a worker whose clock is beyond the budget and given back
#: unstarted, as CLOCK_UNCERTAIN (``reading`` is the claim's own measurement).
run_held = Signal(name="run_held", providing_args=["task_id", "task_name", "reading", "budget"])
#: The ledger ended a run as EXPIRED on its own, not at a gate: the sweeper (a run never
#: claimed in time, or paused past its deadline: ``deadline_passed``, or ``delivery_expired``
#: for a delivery task's run, the reasons a gate gives for the same deadline), the
#: reconciler, or beat (``missed_occurrence``); or a running attempt whose run was
#: cancelled, when its body ends (``cancelled``). Gate refusals are ``deadline_refused``.
run_expired = Signal(
    name="run_expired", providing_args=["task_id", "task_name", "reason", "detail"]
)
#: A run was cancelled with everything it started (``celery_deadlines.cancel``, ``manage.py
#: deadlines cancel``, the admin), in the process that cancelled: ``runs`` is how many
#: unended runs of its tree it changed (0: it had ended), ``by`` who cancelled and
#: ``reason`` why. Each of those runs ends ``cancelled`` later, where it is found.
run_cancelled = Signal(name="run_cancelled", providing_args=["task_id", "runs", "by", "reason"])
#: A run was claimed: ``queue_wait`` (a timedelta, by the ledger's clock) is how long it
#: waited for a worker since it became claimable.
run_claimed = Signal(name="run_claimed", providing_args=["task_id", "task_name", "queue_wait"])
#: A fenced write of a stale attempt was refused by the ledger: ``write`` is what it
#: tried (``checkpoint``, ``succeed``, ``retry``, ``dispatch``, ...).
write_refused = Signal(name="write_refused", providing_args=["task_id", "write"])
#: The dispatch guard refused a side effect (``reason`` as in DispatchRefused).
dispatch_refused = Signal(name="dispatch_refused", providing_args=["task_id", "key", "reason"])
#: A run resumed a stored plan: ``verdict`` is the plans.Verdict, ``action`` what the
#: run does about it (``continue`` or the contract's ``on_expiry``).
plan_resumed = Signal(
    name="plan_resumed", providing_args=["task_id", "task_name", "verdict", "action"]
)

#: A run needs a person: it ended UNKNOWN with effects whose outcome only an operator can
#: settle (no reconciler of its task answers for them). ``keys``: those effects' keys;
#: sent once per run, where it ended UNKNOWN (its pool process, the worker whose hard
#: time limit killed it, or the reconciler that found its lease lapsed), with an ERROR
#: log record that error trackers pick up.
operator_needed = Signal(
    name="operator_needed", providing_args=["task_id", "task_name", "keys", "detail"]
)


def report_operator_needed(
    sender: object, task_id: str, task_name: str, keys: list[str], detail: str
) -> None:
    """Log at ERROR (once per run: the caller ends the run UNKNOWN exactly once) and send
    :data:`operator_needed`. The record's ``extra`` names the run for an error tracker
    (Sentry's logging integration puts it in the event's extra data)."""
    logger.error(
        "%s[%s] needs an operator: the outcome of effect(s) %s is unknown (%s) and no "
        "reconciler of its task can settle it; find out what happened and resolve it "
        "with evidence (admin: Effects, resolve; manage.py deadlines explain %s)",
        task_name,
        task_id,
        ", ".join(keys),
        detail,
        task_id,
        extra={
            "celery_deadlines.task_id": task_id,
            "celery_deadlines.task_name": task_name,
            "celery_deadlines.effect_keys": list(keys),
        },
    )
    operator_needed.send(
        sender=sender, task_id=task_id, task_name=task_name, keys=keys, detail=detail
    )
