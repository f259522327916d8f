"""The gates, as pure functions of instants, durations and a clock reading.

Each returns a :class:`Decision` with a stable reason code; nothing here reads a clock,
a setting or a message, so every rule is testable with plain values. The Celery glue
(``task.py``, ``request.py``) only gathers the inputs and acts on the decision.

=========  ====================================================================
gate       refuses when
=========  ====================================================================
enqueue    the deadline has passed, or less than ``reserve`` would be left when
           the message may first start (``eta``/``countdown`` included); or the
           queue ahead of it cannot reach it in time (``queue_backlog``:
           :mod:`celery_deadlines.rules.backlog`)
claim      same rule, when a worker actually takes the message (time spent in
           the queue and behind busy pool processes has been spent); a message
           whose envelope cannot be judged (``invalid_message``:
           :mod:`celery_deadlines.rules.envelope`); with the ledger, also a
           message that names another task than the run of its id
           (``task_mismatch``: the run is left as it is)
attempt    never refuses by itself: it caps the attempt's time limits at the
           budget left (:func:`cap_time_limits`)
retry      ``countdown + attempt_timeout + skew_allowance > remaining`` (or less
           than ``reserve`` would be left when the retry is due)
workflow   at the enqueue of a chain, group or chord: its critical path needs
           more than the time left (:func:`celery_deadlines.rules.workflows.fit`)
outbound   a call to another service (HTTP, gRPC) would start with no more than
           its reserve left (:func:`celery_deadlines.rules.outgoing.admit`)
=========  ====================================================================
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime, timedelta
from typing import Final, NamedTuple

from ..errors import DeadlineRefused, InvalidDeadline, WorkflowRefused
from .budgets import capped_seconds

ZERO = timedelta(0)
#: The wall clock's resolution: "before the deadline" is "at most this before it".
TICK = timedelta(microseconds=1)


class Gate(enum.StrEnum):
    """Where a decision is taken."""

    ENQUEUE = "enqueue"
    CLAIM = "claim"
    ATTEMPT = "attempt"
    RETRY = "retry"
    #: a call to another service, before any byte of it is sent (rules/outgoing.py)
    OUTBOUND = "outbound"
    #: a query of the task body, cut by the deadline (rules/database.py)
    DATABASE = "database"
    #: not a rule: a person ended the run (the admin's *expire now*)
    OPERATOR = "operator"
    #: not a rule: a run that waited for an effect's outcome was released once it was
    #: settled (by its task's reconciler or an operator), and its deadline had passed
    RELEASE = "release"


class Reason(enum.StrEnum):
    """Why a gate refused. The values are stable: store them, alert on them."""

    DEADLINE_PASSED = "deadline_passed"
    INSUFFICIENT_BUDGET = "insufficient_budget"
    RETRY_BUDGET_EXHAUSTED = "retry_budget_exhausted"
    INVALID_DEADLINE = "invalid_deadline"
    #: a delivery task (``deadline_kind="delivery"``) past its delivery deadline
    DELIVERY_EXPIRED = "delivery_expired"
    #: a chain, group or chord whose critical path needs more than the time left
    #: (:mod:`celery_deadlines.rules.workflows`); nothing of it was published
    WORKFLOW_CANNOT_FIT = "workflow_cannot_fit"
    #: a message that carries the id of a run of another task (its ``task`` is not the
    #: run's): refused by the ledger's claim, the run left as it was, nothing stored
    #: under the id (it is the other run's)
    TASK_MISMATCH = "task_mismatch"
    #: a DeadlineTask's message whose envelope cannot be judged (an id that is not a
    #: task id, a ``retries`` or ``timelimit`` of another type, a body that is not
    #: Celery's: :mod:`celery_deadlines.rules.envelope`), refused before it is judged
    INVALID_MESSAGE = "invalid_message"
    #: a run cancelled with everything it started (``celery_deadlines.cancel``): its
    #: deadline was pulled in to the cancel's instant; refused at the claim, ended by
    #: whoever finds it past, told to its caller as Celery's revoke (``REVOKED``)
    CANCELLED = "cancelled"
    #: a publish the queue ahead of it could not reach before its last start, at the
    #: rate the queue was seen served (or, under overload, only after more than a
    #: share of its budget): :mod:`celery_deadlines.rules.backlog`; nothing published
    QUEUE_BACKLOG = "queue_backlog"


class Decision(NamedTuple):
    """A gate's verdict and everything needed to explain it (a tuple: cheap to make)."""

    gate: Gate
    reason: Reason | None
    deadline: datetime | None
    clock_reading: datetime
    remaining: timedelta | None
    detail: str = ""

    @property
    def allowed(self) -> bool:
        return self.reason is None

    def refusal(self) -> DeadlineRefused:
        """The exception that reports this refusal to the caller."""
        if self.reason is None:
            raise ValueError("an allowed decision is not a refusal")
        kind = WorkflowRefused if self.reason is Reason.WORKFLOW_CANNOT_FIT else DeadlineRefused
        return kind(
            self.gate.value,
            self.reason.value,
            self.deadline.isoformat() if self.deadline else None,
            self.clock_reading.isoformat(),
            self.detail,
        )


def expiry_reason(*, delivery_task: bool) -> Reason:
    """The one reason a run ends for its deadline, whoever finds it past (a gate, the
    sweeper, the reconciler, the time limit at the deadline's cap): a delivery task's
    deadline is its delivery deadline (``delivery_expired``), any other's is
    ``deadline_passed``."""
    return Reason.DELIVERY_EXPIRED if delivery_task else Reason.DEADLINE_PASSED


def retry_wait(
    eta: datetime | None, countdown: float | None, default_delay: float | None, now: datetime
) -> timedelta:
    """How long a retry waits before it may start, as ``Task.retry`` reads its options:
    ``eta``, else ``countdown``, else the task's ``default_retry_delay`` (never negative)."""
    if eta is not None:
        return max(eta - now, timedelta(0))
    delay = default_delay if countdown is None else countdown
    wait = capped_seconds(delay or 0)
    if wait is None:
        raise InvalidDeadline(f"a retry's countdown must be a number of seconds, got {delay}")
    return max(wait, timedelta(0))


def claim_refusal(why: str) -> Reason | None:
    """The gate's reason for a claim the ledger refused by a gate's rule (``why`` is the
    ledger's): for the deadline, judged by the database's clock and the run's own
    deadline, as the claim was (``deadline_passed``, or ``deadline`` for less than the
    reserve left: ``insufficient_budget``); or ``task_mismatch``, a message naming
    another task than the run of its id. ``None`` when the claim was refused for
    something else (a duplicate, a held or ended run: nothing to report)."""
    if why == "cancelled":
        return Reason.CANCELLED
    if why == "deadline_passed":
        return Reason.DEADLINE_PASSED
    if why == "deadline":
        return Reason.INSUFFICIENT_BUDGET
    if why == "task_mismatch":
        return Reason.TASK_MISMATCH
    return None


def task_mismatch(named: str, now: datetime, deadline: datetime | None) -> Decision:
    """The claim's refusal of a message that names task ``named`` and carries the id of a
    run of another task (``deadline``: the message's own; ``now``: the ledger's clock)."""
    return Decision(
        gate=Gate.CLAIM,
        reason=Reason.TASK_MISMATCH,
        deadline=deadline,
        clock_reading=now,
        remaining=None,
        detail=(
            f"the run of this id is not a run of {named}: a message runs only a run of its "
            "own task; the run is left as it was, and nothing is stored under its id"
        ),
    )


def admit(
    gate: Gate,
    deadline: datetime,
    now: datetime,
    reserve: timedelta = ZERO,
    starts_at: datetime | None = None,
) -> Decision:
    """May work that must finish by ``deadline`` start at ``starts_at`` (default ``now``)?

    Used by the enqueue and claim gates. Refused with ``deadline_passed`` when no time
    is left at the start, and with ``insufficient_budget`` when less than ``reserve``
    is (``remaining == reserve`` is still allowed).
    """
    start = now if starts_at is None or starts_at < now else starts_at
    remaining = deadline - start
    if remaining <= ZERO:
        waited = "" if start == now else f" at its earliest start {start.isoformat()}"
        return Decision(
            gate=gate,
            reason=Reason.DEADLINE_PASSED,
            deadline=deadline,
            clock_reading=now,
            remaining=remaining,
            detail=f"deadline passed {seconds(-remaining)} ago{waited}",
        )
    if remaining < reserve:
        return Decision(
            gate=gate,
            reason=Reason.INSUFFICIENT_BUDGET,
            deadline=deadline,
            clock_reading=now,
            remaining=remaining,
            detail=f"{seconds(remaining)} left, below the reserve of {seconds(reserve)}",
        )
    return Decision(gate, None, deadline, now, remaining)


def latest_start(deadline: datetime, reserve: timedelta = ZERO) -> datetime:
    """The last instant :func:`admit` allows work that must finish by ``deadline`` to
    start: ``admit(gate, deadline, now, reserve).allowed`` is ``now <= latest_start(...)``.

    For a caller that judges one message several times (the worker's claim gate, on
    arrival and again when the message is handed to the pool): worked out once, each
    judgment is one comparison, and :func:`admit` is asked only for a refusal.
    """
    try:
        return deadline - max(reserve, TICK)  # no time left is refused, at any reserve
    except OverflowError:  # a reserve longer than the time since year 1
        return datetime.min.replace(tzinfo=UTC)


def invalid(gate: Gate, now: datetime, detail: str) -> Decision:
    """The refusal for a deadline header that cannot be read."""
    return Decision(
        gate=gate,
        reason=Reason.INVALID_DEADLINE,
        deadline=None,
        clock_reading=now,
        remaining=None,
        detail=detail,
    )


def invalid_message(gate: Gate, now: datetime, detail: str) -> Decision:
    """The refusal for a message whose envelope cannot be judged (``detail``: what is
    wrong with it, :func:`celery_deadlines.rules.envelope.flaw`)."""
    return Decision(
        gate=gate,
        reason=Reason.INVALID_MESSAGE,
        deadline=None,
        clock_reading=now,
        remaining=None,
        detail=detail,
    )


def allow_retry(
    deadline: datetime,
    now: datetime,
    *,
    remaining: timedelta,
    countdown: timedelta,
    attempt_timeout: timedelta,
    skew_allowance: timedelta,
    reserve: timedelta = ZERO,
) -> Decision:
    """May a retry that waits ``countdown`` and then runs up to ``attempt_timeout`` go ahead?

    Refused when ``countdown + attempt_timeout + skew_allowance > remaining``. A task's
    ``reserve`` is honoured too (the retried message must be claimable when it is
    due), so what follows the countdown is the larger of the two.
    ``remaining`` is measured on the monotonic clock since the attempt started; ``now``
    and ``deadline`` are only for the explanation.
    """
    run = attempt_timeout + skew_allowance
    needed = countdown + max(run, reserve)
    if needed > remaining:
        after = (
            f"attempt timeout {seconds(attempt_timeout)} + skew allowance {seconds(skew_allowance)}"
            if run >= reserve
            else f"reserve {seconds(reserve)}"
        )
        return Decision(
            gate=Gate.RETRY,
            reason=Reason.RETRY_BUDGET_EXHAUSTED,
            deadline=deadline,
            clock_reading=now,
            remaining=remaining,
            detail=f"a retry needs {seconds(needed)} (countdown {seconds(countdown)} + {after}) "
            f"but {seconds(remaining)} left",
        )
    return Decision(Gate.RETRY, None, deadline, now, remaining)


#: The shortest time limit the attempt gate gives (seconds): billiard reads 0 as "no
#: limit", so a nearly spent budget must not become 0.
MIN_TIME_LIMIT: Final = 0.01


def cap_time_limits(
    remaining: float,
    hard: float | None,
    soft: float | None,
    floor: float,
) -> tuple[float, float | None]:
    """The attempt gate: hard and soft time limits (seconds, as Celery's) capped at the
    budget left, ``remaining`` seconds.

    The hard limit is always set, at most the budget left: an attempt never outlives
    the deadline. A soft limit is kept only if the task has one; when the task has
    both, the capped soft limit keeps the task's soft/hard ratio, so the cleanup
    window the task asked for shrinks with the budget instead of vanishing (a soft
    limit at the same instant as the hard one would never be handled). ``floor``
    keeps a nearly spent budget from becoming 0, which billiard reads as "no limit".
    """
    budget = max(remaining, floor)
    task_hard = hard if hard is not None and hard > 0 else None
    capped_hard = budget if task_hard is None else min(task_hard, budget)
    if soft is None or soft <= 0:
        return capped_hard, None
    if task_hard is not None and soft < task_hard:
        return capped_hard, max(min(soft, capped_hard * soft / task_hard), floor)
    return capped_hard, min(soft, capped_hard)


def seconds(duration: timedelta) -> str:
    """A duration in a refusal's detail: seconds to the millisecond (``2.500 s``)."""
    return f"{duration.total_seconds():.3f} s"


def as_delivery(decision: Decision) -> Decision:
    """The same decision for a delivery task: a passed deadline is ``delivery_expired``."""
    if decision.reason is not Reason.DEADLINE_PASSED:
        return decision
    return decision._replace(reason=Reason.DELIVERY_EXPIRED)
