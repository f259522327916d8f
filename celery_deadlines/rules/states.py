"""The one vocabulary of states: a run's :class:`Status`, an effect's :class:`EffectState`,
and the sets the rules and the ledger's SQL are written with. Pure: no Django, no I/O.

The ledger's tables take their ``choices`` from here (:mod:`celery_deadlines.models`), and
its statements their status lists (:mod:`celery_deadlines.ledger.sql.predicates`), so a
set is written once. The states are drawn in docs/explanation/run-ledger.md.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any, Final


class Status(enum.StrEnum):
    """Where a run is in its life."""

    QUEUED = "QUEUED"
    #: a worker whose clock disagreed with the ledger's took the run and gave it back
    #: unstarted; a worker whose clock agrees publishes it again (not failed, not expired)
    CLOCK_UNCERTAIN = "CLOCK_UNCERTAIN"
    RUNNING = "RUNNING"
    RETRYING = "RETRYING"
    UNKNOWN = "UNKNOWN"
    #: the run's resumed plan may not go on and its contract says ``pause`` or
    #: ``escalate``: it waits for a person (the admin's *requeue*) or its deadline
    PAUSED = "PAUSED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    EXPIRED = "EXPIRED"


STATUS_LABELS: Final = {
    Status.QUEUED: "queued",
    Status.CLOCK_UNCERTAIN: "clock uncertain (held)",
    Status.RUNNING: "running",
    Status.RETRYING: "retrying",
    Status.UNKNOWN: "unknown (to reconcile)",
    Status.PAUSED: "paused (waits for a person)",
    Status.SUCCEEDED: "succeeded",
    Status.FAILED: "failed",
    Status.EXPIRED: "expired",
}

#: A run in one of these states never changes again.
TERMINAL: Final = frozenset({Status.SUCCEEDED, Status.FAILED, Status.EXPIRED})
#: A run in one of these states waits for a worker to claim it.
CLAIMABLE: Final = frozenset({Status.QUEUED, Status.RETRYING, Status.CLOCK_UNCERTAIN})
#: Unfinished runs no worker holds: their deadline ends them (by the database clock).
WAITING: Final = CLAIMABLE | {Status.PAUSED}
#: What an operator may queue again (a live lease aside, checked in the statement).
REQUEUEABLE: Final = WAITING | {Status.UNKNOWN, Status.FAILED}


class EffectState(enum.StrEnum):
    """Where a side effect is: at most one dispatch without a recorded outcome."""

    INTENT_RECORDED = "INTENT_RECORDED"
    DISPATCHED = "DISPATCHED"
    SUCCEEDED = "SUCCEEDED"
    UNKNOWN = "UNKNOWN"
    FAILED = "FAILED"
    NOT_DISPATCHED = "NOT_DISPATCHED"


EFFECT_LABELS: Final = {
    EffectState.INTENT_RECORDED: "intent recorded",
    EffectState.DISPATCHED: "dispatched",
    EffectState.SUCCEEDED: "succeeded",
    EffectState.UNKNOWN: "unknown (to reconcile)",
    EffectState.FAILED: "failed",
    EffectState.NOT_DISPATCHED: "not dispatched",
}

#: Dispatched without a known outcome: the run waits for reconciliation.
UNRESOLVED: Final = frozenset({EffectState.DISPATCHED, EffectState.UNKNOWN})
#: An outcome is recorded: replayed, never dispatched again.
COMPLETED: Final = frozenset({EffectState.SUCCEEDED, EffectState.FAILED})
#: The guard may dispatch from these (a first time, or again after "certainly not sent").
DISPATCHABLE: Final = frozenset({EffectState.INTENT_RECORDED, EffectState.NOT_DISPATCHED})


#: The Celery state a caller's ``AsyncResult`` shows while a run waits for an effect's
#: outcome to be reconciled. Not one of Celery's ready states: ``get()`` keeps waiting
#: (until its timeout) for the final SUCCESS or FAILURE that replaces it.
CALLER_UNKNOWN: Final = "UNKNOWN"
#: The task event a run that ended UNKNOWN is announced with (by its worker, or by the
#: reconciler): Flower (``celery.events.state``) shows an event type it has no state for
#: as its upper-cased suffix, here ``UNKNOWN``, ranked above STARTED and RECEIVED and
#: below SUCCESS and FAILURE, so the settled outcome's event still replaces it.
UNKNOWN_EVENT: Final = "task-unknown"


def choices(states: Iterable[enum.StrEnum], labels: Mapping[Any, str]) -> list[tuple[str, str]]:
    """Django ``choices`` for a field holding ``states``."""
    return [(state.value, labels[state]) for state in states]
