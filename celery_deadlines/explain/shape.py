"""What ``explain`` knows about a run, as plain JSON values: the one shape both the text
and ``--json`` are made from.

Every instant is ISO 8601 in UTC to the millisecond with a ``Z`` (:func:`utc`), read by
the database clock; every duration is in seconds, a float rounded to the millisecond
(:func:`seconds`). ``None`` is ``null``: not known, or not applicable (a run with no
deadline has no time left; a run that has not ended has no ``ended``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict


class Event(TypedDict):
    """One compare-and-swap on the run (applied by the trigger, or rejected)."""

    at: str
    kind: str
    outcome: str
    status: str
    reason: str
    version: int
    token: int
    owner: str
    lease_expires_at: str | None
    detail: str


class Replay(TypedDict):
    """The run's recorded message published again (an event of the history)."""

    at: str
    kind: str
    by: str
    status: str
    token: int
    detail: str


class Child(TypedDict):
    task_id: str
    task_name: str
    status: str
    reason: str


class EffectFacts(TypedDict):
    key: str
    name: str
    kind: str
    state: str
    token: int
    dispatches: int
    dispatched_at: str | None
    error: str
    evidence: Any


class PlanFacts(TypedDict):
    plan_id: str
    state: str
    reason: str
    detail: str
    created_at: str
    ended_at: str | None


class Refused(TypedDict):
    """A write refused to a stale holder (or for stale evidence, or a message that named
    another task than the run's: its detail ``task_mismatch:<that task>``)."""

    kind: str
    owner: str
    token: int
    at: str
    detail: str


class Checkpoint(TypedDict):
    name: str
    at: str | None
    token: int | None
    data: Any


class Ended(TypedDict):
    """When a run reached its final status (SUCCEEDED, FAILED, EXPIRED), and how long
    it took: how long it ran (its time RUNNING, summed over its attempts; ``null``: never
    claimed), from its enqueue, and how far before its deadline (negative: after it;
    ``null``: no deadline)."""

    at: str
    ran_seconds: float | None
    after_enqueue_seconds: float
    before_deadline_seconds: float | None


class Cancelled(TypedDict):
    """The cancel that reached the run (``celery_deadlines.cancel``, ``manage.py deadlines
    cancel``, the admin; the last, if more than one did): when (the database clock), who
    and why (as its history keeps them), and what was running at that instant: the run's
    own status then, the attempt that held it (its owner and token; ``null``: none ran),
    the effects it had dispatched by then, and the runs of its tree that were running."""

    at: str
    by: str
    reason: str
    status_then: str
    owner_then: str | None
    token_then: int | None
    effects_dispatched_by_then: list[str]
    running_in_its_tree_then: list[str]


class TimeLimits(TypedDict):
    """The time limits one attempt was given, as its claim recorded them (the worker's
    main process works them out when it hands the job to the pool, a few milliseconds
    before the claim), whatever the explaining process's settings: each limit in
    seconds (``null``: none) and who set it (``message``, ``task``, ``app``, ``worker``
    or ``deadline``); for one the deadline set, what Celery would have given instead
    (``null``: nothing). ``recorded`` false: claimed before the claim recorded them
    (nothing is known of them but the time the deadline left); ``eager``: an eager run,
    under no time limit. Only the prefork and gevent pools enforce them
    (docs/explanation/pools.md)."""

    attempt: int
    at: str
    token: int
    recorded: bool
    eager: bool
    hard_seconds: float | None
    hard_set_by: str | None
    hard_celery_seconds: float | None
    hard_celery_set_by: str | None
    soft_seconds: float | None
    soft_set_by: str | None
    soft_celery_seconds: float | None
    soft_celery_set_by: str | None
    #: the time the deadline left at the claim (``null``: no deadline)
    deadline_left_seconds: float | None


class NextEffect(TypedDict):
    key: str
    state: str


class UnknownEffect(TypedDict):
    key: str
    error: str
    evidence: Any


class Occurrence(TypedDict):
    schedule: str | None
    zone: str | None
    local: str | None
    not_before: str | None


class Explanation(TypedDict):
    """The operator checklist for one run (docs/howto/explain.md)."""

    task_id: str
    task_name: str
    status: str
    reason: str
    detail: str
    #: the database clock when the ledger was read: every duration below is against it
    database_clock: str
    created_at: str
    deadline: str | None
    delivery_deadline: str | None
    delivery_task: bool | None
    #: by the database clock; negative once the deadline has passed; ``null`` for a run
    #: that has ended (see ``ended``) or has no deadline
    time_left_seconds: float | None
    ended: Ended | None
    #: the cancel that reached it; ``null``: never cancelled
    cancelled: Cancelled | None
    #: what moves the run next (for UNKNOWN: what resolves it)
    next_step: str
    #: the owner of a live lease; ``null``: nobody may act on the run now
    owner: str | None
    #: who made the run's last claim (``null``: never claimed)
    last_owner: str | None
    lease_expires_at: str | None
    lease_live: bool
    fencing_token: int
    #: the current token's claim, else the last claim (the run was released since)
    claimed_version: int | None
    claimed_at: str | None
    claimed_token: int | None
    #: the first claim (the body starts right after a claim); ``null``: never claimed
    started_at: str | None
    #: its time RUNNING, summed over its attempts (a running one's up to the database
    #: clock); ``null``: never claimed
    runtime_seconds: float | None
    #: each attempt's, oldest first (one per claim)
    time_limits: list[TimeLimits]
    #: a failed body's traceback, as kept (bounded); ``null``: none kept
    traceback: str | None
    version: int
    attempts: int
    lost_leases: int
    last_checkpoint: Checkpoint | None
    writes_allowed_for_token: int | None
    stale_writes_refused: list[Refused]
    next_effect: NextEffect | None
    unknown_effects: list[UnknownEffect]
    effects: list[EffectFacts]
    root_id: str
    parent_id: str
    children: list[Child]
    occurrence: Occurrence | None
    plans: list[PlanFacts]
    replays: list[Replay]
    history: list[Event]


def utc(instant: datetime | None) -> str:
    """An instant as the operator reads it: ISO 8601 in UTC, to the millisecond (``-``
    for none)."""
    if instant is None:
        return "-"
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def instant(value: datetime | None) -> str | None:
    """:func:`utc`, with ``None`` for none (JSON's ``null``)."""
    return None if value is None else utc(value)


def seconds(duration: timedelta) -> float:
    """A duration in seconds, to the millisecond."""
    return round(duration.total_seconds(), 3)
