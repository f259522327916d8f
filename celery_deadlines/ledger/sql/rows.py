"""What the ledger's statements take and return: plain, frozen values.

Nothing here runs a statement. What crosses to the Celery tier (:class:`NewRun`,
:class:`Lease`, :class:`ClaimRefused`, :class:`EndedRun`) is defined with the pure rules
(:mod:`celery_deadlines.rules.records`) and imported here by name; the values below
stay between the ledger's modules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ...rules.records import ENDED_IT, ClaimRefused, EndedRun, KeptResult, Lease, NewRun, Refusal


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
    #: its deadline was pulled in by a cancel: it ends ``cancelled``
    cancelled: bool = False


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


@dataclass(frozen=True)
class Recorded:
    """A run as it was published: its outbox message, the queue Celery routed it to and
    its workflow's root (``None`` where not recorded)."""

    message: Unclaimed
    queue: str | None
    root_id: str | None


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


__all__ = [
    "ENDED_IT",
    "ClaimRefused",
    "EndedRun",
    "ExistingRun",
    "KeptResult",
    "LapsedLease",
    "Lease",
    "NewRun",
    "Recorded",
    "Refusal",
    "Unclaimed",
    "as_bytes",
    "from_json",
    "required",
]
