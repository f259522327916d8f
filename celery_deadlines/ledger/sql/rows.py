"""What the ledger's statements take and return: plain, frozen values.

Nothing here runs a statement; :class:`Lease` and :class:`ClaimRefused` cross from the
ledger to the task tier, the others stay between the ledger's modules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from ...errors import DeadlineRefused


@dataclass(frozen=True)
class NewRun:
    """What the outbox records before a message is published."""

    task_id: str
    task_name: str
    deadline: datetime | None
    delivery_deadline: datetime | None
    root_id: str
    parent_id: str
    retries: int
    available_at: datetime | None
    message_body: bytes | None
    content_type: str
    content_encoding: str
    #: a scheduled run's occurrence (see :class:`celery_deadlines.schedules.Occurrence`)
    not_before: datetime | None = None
    schedule: str | None = None
    schedule_zone: str | None = None
    schedule_local: str | None = None
    #: a delivery task's run: it expires as ``delivery_expired``
    delivery_task: bool = False
    #: the queue the message was routed to (``None``: not known)
    queue: str | None = None


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

    #: ``why`` codes
    TERMINAL: Final = "terminal"
    STALE_MESSAGE: Final = "stale_message"
    #: the run's deadline has passed, by the database clock
    DEADLINE_PASSED: Final = "deadline_passed"
    #: less than the reserve is left before the run's deadline, by the database clock
    DEADLINE: Final = "deadline"
    HELD: Final = "held"
    LOST_LEASES: Final = "lost_leases"
    UNKNOWN: Final = "unknown"
    #: a lapsed attempt dispatched an effect with no recorded outcome: reconcile first
    UNRESOLVED: Final = "unresolved"
    CHANGED: Final = "changed"
    MISSING: Final = "missing"


@dataclass(frozen=True)
class ExistingRun:
    """A run already recorded under a task id a producer is about to publish."""

    task_id: str
    task_name: str
    status: str
    message_body: bytes | None
    content_type: str
    content_encoding: str


@dataclass(frozen=True)
class Expired:
    """A run the ledger ended: expired or failed on its own (the reconciler reports
    these), or read back as it ended (:meth:`~.runs.Runs.ended`)."""

    task_id: str
    task_name: str
    status: str
    reason: str
    deadline: datetime | None
    detail: str = ""
    #: when the run's row last changed, by the database clock: its end, read back
    #: (:meth:`~.runs.Runs.ended`); ``None`` where not read
    ended_at: datetime | None = None

    def refusal(self, gate: str, now: datetime, detail: str) -> DeadlineRefused:
        """What the caller is told of this expiry: ``gate``'s refusal at ``now``."""
        deadline = self.deadline.isoformat() if self.deadline else None
        return DeadlineRefused(gate, self.reason, deadline, now.isoformat(), detail)


@dataclass(frozen=True)
class LapsedLease:
    run_id: int
    task_id: str
    task_name: str
    version: int
    token: int
    owner: str
    lost_leases: int
    deadline: datetime | None
    past_deadline: bool
    delivery_task: bool = False


@dataclass(frozen=True)
class Unclaimed:
    run_id: int
    task_id: str
    task_name: str
    version: int
    retries: int
    available_at: datetime | None
    message_body: bytes | None
    content_type: str
    content_encoding: str


def from_json(value: Any) -> Any:
    """A JSON column as read back (PostgreSQL decodes it; SQLite returns text)."""
    if isinstance(value, (str, bytes)):
        return json.loads(value)
    return value


def required(value: datetime | None) -> datetime:
    if value is None:
        raise ValueError("the database returned no clock reading")
    return value


def as_bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    return bytes(value)
