"""The exceptions celery-deadlines raises, one root and a short hierarchy.

::

    DeadlineError                      root: catch this to catch everything below
    ├── DeadlineRefused                a gate refused to start (or restart) work
    │   ├── WorkflowRefused            a chain, group or chord cannot fit its deadline
    │   └── QueryCut                   a body's database query was cut by the deadline
    ├── InvalidDeadline (ValueError)   a caller passed a deadline or budget that cannot work
    ├── ReservedHeader (ValueError)    a caller's header would replace a field of Celery's message
    ├── ConfigurationError             a setting has a bad value; the message names the setting
    ├── StaleLease                     a write by an attempt that no longer owns its run
    ├── LedgerUnreachable              the ledger's database could not be reached to claim
    ├── RunFailed                      a failed run's outcome, told by a later delivery
    ├── DispatchRefused                the dispatch guard refused a side effect
    ├── PlanRefused                    a resumed plan may not go on, and its contract refuses
    ├── RunConflict (ValueError)       a task id reused for another task or other arguments
    ├── EffectConflict (ValueError)    an effect key reused with other parameters
    └── InvalidEffect (ValueError)     an effect's name, key or parameters cannot be recorded

``DeadlineRefused`` crosses the result backend: the worker stores it as the task's
failure and ``AsyncResult.get()`` raises it again in the caller, with the gate, the
reason, the deadline and the clock reading that decided it. Its ``args`` are plain
JSON values so that Celery's JSON serializer rebuilds the same class on the client.
Celery's ``Ignore``/``Reject``/``Retry`` appear only at the edge, in ``task.py`` and
``request.py``.
"""

from __future__ import annotations

from datetime import datetime


class DeadlineError(Exception):
    """Something about a task's deadline went wrong."""


class DeadlineRefused(DeadlineError):
    """A gate refused to start work that could not finish before its deadline.

    ``gate`` is where the decision was taken (``enqueue``, ``claim``, ``attempt``,
    ``retry``), ``reason`` a stable code (see :class:`celery_deadlines.rules.gates.Reason`),
    ``deadline`` and ``clock_reading`` ISO-8601 UTC instants (``deadline`` is ``None``
    when the header could not be read), ``detail`` one human sentence.
    """

    def __init__(
        self,
        gate: str,
        reason: str,
        deadline: str | None,
        clock_reading: str,
        detail: str = "",
    ) -> None:
        super().__init__(gate, reason, deadline, clock_reading, detail)
        #: the gate that refused: ``enqueue``, ``claim``, ``attempt``, ``retry``, ...
        self.gate = gate
        #: the stable reason code (a :class:`~celery_deadlines.Reason` value)
        self.reason = reason
        #: the deadline judged, an ISO-8601 UTC instant (``None``: unreadable)
        self.deadline = deadline
        #: the clock reading the gate judged it at, an ISO-8601 UTC instant
        self.clock_reading = clock_reading
        #: one sentence saying why, for a person
        self.detail = detail

    @property
    def deadline_at(self) -> datetime | None:
        """The deadline as an aware datetime, or ``None`` if it was unreadable."""
        return datetime.fromisoformat(self.deadline) if self.deadline else None

    @property
    def clock_read_at(self) -> datetime:
        """The clock reading the decision was taken at, as an aware datetime."""
        return datetime.fromisoformat(self.clock_reading)

    def __str__(self) -> str:
        deadline = self.deadline or "unreadable"
        text = (
            f"{self.gate} gate refused: {self.reason} "
            f"(deadline {deadline}, clock read {self.clock_reading})"
        )
        return f"{text}: {self.detail}" if self.detail else text


class PerformedPastDeadline(DeadlineRefused):
    """The run's side effect was performed, and its deadline passed before the run could
    go on: it ended EXPIRED, reason ``performed_past_deadline`` (gate ``release``).

    Not a refusal of work never done: the effects ``detail`` names happened (an operator
    or the task's reconciler found them at the provider after the deadline); the task's
    work after them did not run, and their results were not replayed to it. A
    :class:`DeadlineRefused`, for callers that handle those; its message says what
    happened."""

    def __str__(self) -> str:
        return (
            f"the run ended past its deadline after its side effect was performed: "
            f"{self.reason} (deadline {self.deadline or 'none'}, clock read "
            f"{self.clock_reading}): {self.detail}"
        )


class WorkflowRefused(DeadlineRefused):
    """A chain, group or chord was refused whole at enqueue: its critical path (each
    step's countdown, reserve and attempt timeout) needs more than the time left before
    its deadline. Nothing of it was published. ``reason`` is ``workflow_cannot_fit`` and
    ``detail`` has the arithmetic, with the steps that declare no attempt timeout (they
    count as zero)."""


class QueryCut(DeadlineRefused):
    """A query of the task body was cut by the run's deadline (gate ``database``, reason
    ``deadline_passed``): the database's ``statement_timeout`` or ``lock_timeout`` the
    library set from the time left ended it, SQLite's query was interrupted, or the
    statement was not sent at all because the deadline had passed. The driver's error,
    when there was one, is its ``__cause__``; ``detail`` names the statement (its first
    characters) and the alias. A body may catch it and go on (record, clean up,
    return); uncaught, the run ends EXPIRED ``deadline_passed``. Inside
    ``transaction.atomic()`` the transaction is rolled back, as with any error."""


class InvalidDeadline(DeadlineError, ValueError):
    """A deadline or budget given by the caller cannot be used (naive, negative, absurd)."""


class ReservedHeader(DeadlineError, ValueError):
    """``apply_async(headers=...)`` names a field of Celery's own message (``id``,
    ``task``, ``retries``, ...: :data:`celery_deadlines.rules.stamping.PROTOCOL_HEADERS`).
    Celery lets such a header replace the field, so the message would carry another
    run's id, or run as another task; each field has its own call option. Nothing was
    recorded or published."""


class ConfigurationError(DeadlineError):
    """A celery-deadlines setting has a value that cannot work; the message names it."""


class StaleLease(DeadlineError):
    """An attempt tried to write (checkpoint, finish, retry) after losing its lease.

    Its lease lapsed (the worker was paused or too slow to renew) or another worker
    claimed the run with a newer fencing token. The write was refused by the database
    and recorded as a rejected :class:`~celery_deadlines.models.RunEvent`; the attempt
    must stop acting on the run. DeadlineTask turns it into Celery's ``Ignore``, so a
    stale attempt stores no result over the current owner's.
    """

    def __init__(self, task_id: str, token: int, write: str, why: str = "") -> None:
        super().__init__(task_id, token, write, why)
        #: the run's task id
        self.task_id = task_id
        #: the fencing token the refused write named
        self.token = token
        #: what was refused: ``checkpoint``, ``succeed``, ``retry``, ``dispatch``, ...
        self.write = write
        #: why the write was refused, when it is not the lease (an effect that moved on)
        self.why = why

    def __str__(self) -> str:
        why = self.why or f"lease token {self.token} is no longer current"
        return f"{self.write} of run {self.task_id} refused: {why}"


class LedgerUnreachable(DeadlineError):
    """A claim could not reach the ledger's database for a whole lease.

    The body did not run; the run is still QUEUED, or was claimed with the answer lost
    (its lease lapses and the reconciler requeues it). A message Celery acknowledges
    late is handed back to the broker instead, and nothing is stored; an early-acked
    one is gone, and this is stored as the task's failure (a run the outbox recorded is
    published again by its sweeper).
    """

    def __init__(self, task_id: str, waited: float, cause: str) -> None:
        super().__init__(task_id, waited, cause)
        #: the run's task id
        self.task_id = task_id
        #: how long the claim tried, in seconds
        self.waited = waited
        #: the database's last error, as text
        self.cause = cause

    def __str__(self) -> str:
        return (
            f"run {self.task_id} could not be claimed: the ledger's database was "
            f"unreachable for {self.waited:.1f} s ({self.cause})"
        )


class RunFailed(DeadlineError):
    """The run failed, as its ledger recorded it (``reason``, ``detail``: the error's
    repr, or what ended it); stored for the caller by a later delivery of its message,
    or by the sweeper when the run's recorded message cannot be published again
    (``message_unreadable``).

    The worker that ended the run died (or stalled) after the ledger's commit and
    before Celery stored the body's own exception: the message came back, its claim
    found the run ended, and the caller, still waiting, is told what the ledger knows.
    The original exception's class is not kept; ``detail`` names it. A worker that only
    stalled stores its own exception when it resumes, which then replaces this one.
    """

    def __init__(self, task_id: str, reason: str, detail: str) -> None:
        super().__init__(task_id, reason, detail)
        #: the run's task id
        self.task_id = task_id
        #: the reason the ledger recorded
        self.reason = reason
        #: the error's ``repr``, or what ended the run
        self.detail = detail

    def __str__(self) -> str:
        return f"run {self.task_id} failed ({self.reason}): {self.detail}"


class DispatchRefused(DeadlineError):
    """The dispatch guard refused a side effect: the external call must not be made.

    ``reason`` is ``stale_lease`` (another attempt owns the run, or this attempt's lease
    lapsed), ``deadline_passed``, ``unresolved`` (an earlier dispatch of the same key
    has no recorded outcome yet: it must be reconciled first) or ``stale_evidence`` (an
    observation the effect relies on is too old for its action class).
    """

    def __init__(self, key: str, reason: str, detail: str = "") -> None:
        super().__init__(key, reason, detail)
        #: the effect's key
        self.key = key
        #: ``stale_lease``, ``deadline_passed``, ``unresolved`` or ``stale_evidence``
        self.reason = reason
        #: one sentence saying why, for a person
        self.detail = detail

    def __str__(self) -> str:
        text = f"dispatch of effect {self.key} refused: {self.reason}"
        return f"{text} ({self.detail})" if self.detail else text


class EffectConflict(DeadlineError, ValueError):
    """An effect key was reused with different request parameters (its fingerprint)."""


class RunConflict(DeadlineError, ValueError):
    """``apply_async(task_id=...)`` named a run that already exists for another task or
    other arguments. Nothing was published: a task id is one run. (The same task with the
    same arguments is not a conflict: the existing run's result is returned, as with an
    idempotency key.)"""

    def __init__(self, task_id: str, task_name: str, status: str, why: str) -> None:
        super().__init__(task_id, task_name, status, why)
        #: the task id named
        self.task_id = task_id
        #: the task of the run that already has it
        self.task_name = task_name
        #: that run's status
        self.status = status
        #: what differs, in words: the task, the arguments, or a recorded message that
        #: cannot be compared
        self.why = why

    def __str__(self) -> str:
        return (
            f"task id {self.task_id} is already the run of {self.task_name} "
            f"({self.status}): {self.why}; nothing was published"
        )


class InvalidEffect(DeadlineError, ValueError):
    """An effect's name, key or fingerprint parameters cannot be recorded (empty, not a
    string, too long for its column, or not serialisable); raised before anything is
    written or called."""


class PlanRefused(DeadlineError):
    """A resumed plan failed its gate and the task's contract says ``on_expiry: refuse``.

    ``reason`` is ``plan_expired`` (its validity ended) or ``assumption_changed`` (the
    world no longer matches what it was made from); ``detail`` says which, in words a
    user can read. The run ends FAILED with that reason, and the plan is kept as
    invalidated history. Like :class:`DeadlineRefused` it crosses the result backend.
    """

    def __init__(self, reason: str, detail: str = "", plan_id: str = "") -> None:
        super().__init__(reason, detail, plan_id)
        #: ``plan_expired`` or ``assumption_changed``
        self.reason = reason
        #: which, in words a user can read
        self.detail = detail
        #: the refused plan's id
        self.plan_id = plan_id

    def __str__(self) -> str:
        plan = f"plan {self.plan_id}" if self.plan_id else "the plan"
        text = f"{plan} refused on resume: {self.reason}"
        return f"{text}: {self.detail}" if self.detail else text
