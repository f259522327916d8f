"""What the ledger and the Celery tier hand each other: plain, frozen values.

The Celery tier builds a :class:`NewRun` when it publishes (the ledger answers when to
send its message: :class:`Recorded`) and reads a :class:`Lease`,
a :class:`ClaimRefused` or a :class:`Held` back from a claim, and an :class:`EndedRun`
from a run that ended; the ledger's statements take and return them. Nothing here runs
a statement or reads the clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, ClassVar, Final

from ..errors import DeadlineRefused, RunFailed
from .gates import Gate
from .skew import ClockReading, describe
from .states import Status

#: Makes an instance without its ``__init__`` (:meth:`Lease.claimed`).
_new: Final = object.__new__


@dataclass(frozen=True)
class NewRun:
    """What the outbox records before a message is published."""

    task_id: str
    task_name: str
    deadline: datetime | None = None
    delivery_deadline: datetime | None = None
    #: the workflow's first task and this task's parent (``""``: none)
    root_id: str = ""
    parent_id: str = ""
    retries: int = 0
    #: when the run may first be claimed (a countdown or eta); ``None``: at once
    available_at: datetime | None = None
    #: the message as the outbox keeps it (:func:`~celery_deadlines.ledger.outbox.encode_message`)
    message_body: bytes | None = None
    content_type: str = "application/json"
    content_encoding: str = "utf-8"
    #: a scheduled run's occurrence (see :class:`celery_deadlines.rules.schedules.Occurrence`)
    not_before: datetime | None = None
    schedule: str | None = None
    schedule_zone: str | None = None
    schedule_local: str | None = None
    #: a delivery task's run: it expires as ``delivery_expired``
    delivery_task: bool = False
    #: the queue the message was routed to (``None``: not known)
    queue: str | None = None


class Recorded(Enum):
    """What the ledger did with a new run's row, and so when the Celery tier sends the
    run's message (the ledger never sends it: a message is the Celery tier's)."""

    #: recorded outside a transaction: send it now (a send that raises is told to the
    #: ledger, which ends the run ``publish_failed``: the caller knows nothing was sent)
    NOW = "now"
    #: recorded in the caller's transaction: send it when that commits (never on a
    #: rollback; a send that fails then is the outbox sweeper's to publish again)
    AT_COMMIT = "at_commit"
    #: the same run (task and arguments) was recorded under this id before: nothing is
    #: sent, the caller reads the run's result
    ALREADY = "already"


@dataclass(frozen=True)
class Lease:
    """A won claim: the fencing token and what the attempt resumes from."""

    run_id: int
    task_id: str
    token: int
    version: int
    attempt: int
    expires_at: datetime | None
    deadline: datetime | None
    checkpoint_name: str
    checkpoint_data: Any
    database_now: datetime
    #: when the run last became claimable (its publish, or a retry's countdown end)
    waiting_since: datetime | None = None
    #: who claimed it (``host:pid``): with the token, the fence of every later write
    owner: str = ""

    @classmethod
    def claimed(
        cls,
        run_id: int,
        task_id: str,
        token: int,
        version: int,
        attempt: int,
        expires_at: datetime | None,
        deadline: datetime | None,
        checkpoint_name: str,
        checkpoint_data: Any,
        database_now: datetime,
        waiting_since: datetime | None,
        owner: str,
        /,
    ) -> Lease:
        """The lease a won claim returns, every field given in order: the same value as
        the constructor's, made without it (a frozen dataclass's ``__init__`` sets each
        field through ``object.__setattr__``: for these twelve, 18,000 instructions,
        more than any other step of a claim in the client but the statement)."""
        lease = _new(cls)
        lease.__dict__.update(
            {
                "run_id": run_id,
                "task_id": task_id,
                "token": token,
                "version": version,
                "attempt": attempt,
                "expires_at": expires_at,
                "deadline": deadline,
                "checkpoint_name": checkpoint_name,
                "checkpoint_data": checkpoint_data,
                "database_now": database_now,
                "waiting_since": waiting_since,
                "owner": owner,
            }
        )
        return lease


@dataclass(frozen=True)
class Refusal:
    """What a gate's refusal of a message did to its run in the ledger (``outcome`` is
    one of the codes below): ended it, or why not, with what the ledger found then.
    True only when it ended the run: only then may the refusal be stored as the task's
    result, and be the run's one refusal logged."""

    outcome: str
    #: the run's status and reason when this refusal did not end it
    status: str = ""
    reason: str = ""
    #: the owner of the live lease (``OWNED``)
    owner: str = ""
    #: the run's deadline and the database clock when it was read (``NOT_CONFIRMED``)
    deadline: datetime | None = None
    database_now: datetime | None = None

    def __bool__(self) -> bool:
        return self.outcome == self.ENDED

    #: this refusal ended the run
    ENDED: ClassVar[str] = "ended"
    #: the run had ended already (``status``, ``reason``): a late or duplicate delivery
    ALREADY_ENDED: ClassVar[str] = "already_ended"
    #: another attempt holds a live lease on the run (``owner``)
    OWNED: ClassVar[str] = "owned"
    #: a refusal for the deadline the database clock does not confirm: the run's deadline
    #: (less the reserve) has not passed by it (``deadline``, ``database_now``)
    NOT_CONFIRMED: ClassVar[str] = "not_confirmed"
    #: the run of the message's id is another task's: left as it was
    TASK_MISMATCH: ClassVar[str] = "task_mismatch"
    #: not ended for another reason (an effect's outcome not recorded, a later attempt)
    NOT_ENDED: ClassVar[str] = "not_ended"


#: A refusal that ended its run (the ledger had no run to keep, or recorded its end).
ENDED_IT: Final = Refusal(Refusal.ENDED)


@dataclass(frozen=True)
class ClaimRefused:
    """A lost claim, and why (``why`` is one of the codes below)."""

    why: str
    status: str
    token: int
    owner: str
    lease_expires_at: datetime | None
    #: the database clock when the claim was refused (what decided it)
    database_now: datetime | None = None

    @classmethod
    def lost(
        cls,
        why: str,
        status: str,
        token: int,
        owner: str,
        lease_expires_at: datetime | None,
        database_now: datetime | None,
        /,
    ) -> ClaimRefused:
        """A lost claim's refusal, every field given in order: made as
        :meth:`Lease.claimed` is."""
        refused = _new(cls)
        refused.__dict__.update(
            {
                "why": why,
                "status": status,
                "token": token,
                "owner": owner,
                "lease_expires_at": lease_expires_at,
                "database_now": database_now,
            }
        )
        return refused

    #: ``why`` codes (class constants: annotated ``Final``, a dataclass would make
    #: each a field of every refusal)
    TERMINAL: ClassVar[str] = "terminal"
    STALE_MESSAGE: ClassVar[str] = "stale_message"
    #: the run was cancelled (its deadline pulled in with everything it started)
    CANCELLED: ClassVar[str] = "cancelled"
    #: the run's deadline has passed, by the database clock
    DEADLINE_PASSED: ClassVar[str] = "deadline_passed"
    #: less than the reserve is left before the run's deadline, by the database clock
    DEADLINE: ClassVar[str] = "deadline"
    HELD: ClassVar[str] = "held"
    LOST_LEASES: ClassVar[str] = "lost_leases"
    UNKNOWN: ClassVar[str] = "unknown"
    #: a lapsed attempt dispatched an effect with no recorded outcome: reconcile first
    UNRESOLVED: ClassVar[str] = "unresolved"
    CHANGED: ClassVar[str] = "changed"
    #: the message names another task than the run of its id (checked first: such a
    #: message is refused so whatever the run's state; its ``owner`` is ``""``)
    TASK_MISMATCH: ClassVar[str] = "task_mismatch"
    MISSING: ClassVar[str] = "missing"


@dataclass(frozen=True)
class KeptResult:
    """A success's return value as the ledger keeps it: encoded with the app's result
    serializer (``body``, ``content_type``, ``encoding``), never decoded with another."""

    body: bytes
    content_type: str
    encoding: str


@dataclass(frozen=True)
class EndedRun:
    """A run as it ended, in whichever final state: one the ledger ended itself
    (expired or failed: the reconciler reports these), or one read back as it ended,
    SUCCEEDED included (:meth:`~.runs.Runs.ended`)."""

    task_id: str
    task_name: str
    status: str
    reason: str
    deadline: datetime | None
    detail: str = ""
    #: when the run's row last changed, by the database clock: its end, read back
    #: (:meth:`~.runs.Runs.ended`); ``None`` where not read
    ended_at: datetime | None = None
    #: a SUCCEEDED run's kept return value, read back; ``None``: none kept
    result: KeptResult | None = None

    def refusal(self, gate: str, now: datetime, detail: str) -> DeadlineRefused:
        """What the caller is told of this expiry: ``gate``'s refusal at ``now``."""
        deadline = self.deadline.isoformat() if self.deadline else None
        return DeadlineRefused(gate, self.reason, deadline, now.isoformat(), detail)

    def told_as(self, now: datetime, worker_lost: Callable[[str], Exception]) -> Exception:
        """What a caller that was not told this FAILED or EXPIRED end is told at ``now``
        (by whoever finds it untold): the claim gate's refusal for an expiry,
        ``worker_lost`` (Celery's ``WorkerLostError``, given by the edge) of the detail
        for a run that lost its workers, else :class:`RunFailed` (the body's exception's
        class is not kept: ``detail`` is its repr)."""
        if self.status == Status.EXPIRED:
            return self.refusal(Gate.CLAIM.value, now, self.detail or "the run had ended EXPIRED")
        if self.reason == "worker_lost":
            return worker_lost(self.detail)
        return RunFailed(self.task_id, self.reason, self.detail)


@dataclass(frozen=True)
class Held:
    """A claim won by a worker whose clock is beyond the skew budget: the run was given
    back unstarted, as CLOCK_UNCERTAIN (or, if that write was refused, left to the
    reconciler: ``recorded`` is False)."""

    reading: ClockReading
    budget: timedelta
    recorded: bool

    def explain(self) -> str:
        return (
            f"clock {describe(self.reading)} from the ledger's clock is beyond the skew "
            f"budget of {self.budget.total_seconds()} s"
        )
