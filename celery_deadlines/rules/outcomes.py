"""How a run ends or moves, and what a side effect's reconciliation found, decided from
plain facts (pure: no clock read, no I/O).

The Celery tier and the ledger gather the facts (the exception a body raised, the
instant a time limit fired, what the reconciler read about a lapsed lease, a resumed
plan's verdict) and ask here what the run's new state is; they then write it. Each
decision is a small value, so the rules are unit-tested without a worker or a database.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal, NamedTuple

from ..errors import DeadlineRefused, DispatchRefused, PlanRefused
from .contracts import OnExpiry
from .gates import Reason, expiry_reason
from .quoting import shown
from .states import Status

# -- a side effect's outcome, as reconciliation finds it -----------------------------------


class Found(NamedTuple):
    """A reconciler's answer: the effect did happen.

    ``result``: what the provider returned (JSON-serialisable), replayed to the task as
    the effect's result; ``evidence``: what shows it (a provider's reference, a
    lookup's answer), kept with the effect and shown by ``explain`` and the admin.
    """

    result: Any = None
    evidence: Any = None


class NotFound(NamedTuple):
    """A reconciler's answer: the effect did not happen; it is safe to dispatch again.

    ``evidence``: what shows it (JSON-serialisable), kept with the effect. Answer it
    only when the provider will refuse the asked ``fence`` from now on (see
    :class:`PendingEffect`).
    """

    evidence: Any = None


class PendingEffect(NamedTuple):
    """What a reconciler is asked about.

    ``fence`` is the dispatch number asked about (``fx.fence`` of that dispatch). A
    reconciler that answers ``NotFound`` says the call *will never* arrive, and a call
    delayed between the dispatch guard and the provider may still be on its way: pass
    ``fence`` to the provider's lookup so that it refuses that fence from then on, and
    ``NotFound`` is certain (a provider that only refuses fences *lower* than one it has
    seen still takes a call delayed past a lookup that found nothing).

    ``key``, ``name`` and ``fingerprint`` are the effect's (``self.effect(name,
    key=..., fingerprint=...)``), ``token`` the lease token of the attempt that
    dispatched it, ``task_id`` its run's. The reconciler returns :class:`Found` or
    :class:`NotFound`; any other answer, or an exception, leaves the effect UNKNOWN for
    the next pass or an operator.
    """

    key: str
    name: str
    fingerprint: str
    token: int
    task_id: str
    fence: int = 1


#: The reason of a run that waited UNKNOWN and whose effects were settled after its
#: deadline with one of them found performed: it ends EXPIRED, the effect done and the
#: task's work after it not (the caller is told
#: :class:`~celery_deadlines.errors.PerformedPastDeadline`).
PERFORMED_PAST_DEADLINE: Final = "performed_past_deadline"
#: The detail of such a run settled past its deadline with nothing performed (reason
#: ``deadline_passed``).
UNPERFORMED_PAST_DEADLINE: Final = (
    "the deadline passed while an effect's outcome was unknown; it was settled as not "
    "performed, and is not dispatched again"
)


def performed_past_deadline_detail(performed: Mapping[str, str]) -> str:
    """The detail of a run ended ``performed_past_deadline`` (``performed``: key ->
    effect name, the run's effects with a recorded success): what was done, and that the
    task's work after it was not."""
    done = ", ".join(f"{name} ({key})" for key, name in sorted(performed.items()))
    return (
        f"performed: {done or 'an effect'}; its outcome was settled after the deadline, "
        "so the task did not go on after it (its result is not replayed)"
    )[:2000]


# -- a run's end after an attempt ------------------------------------------------------------

#: What Celery makes of an exception a body raised (``Ignore``, ``Reject`` with or
#: without requeue): the Celery tier says it, so this module needs no Celery import.
CeleryEnd = Literal["ignore", "reject", "requeue"] | None


@dataclass(frozen=True)
class Outcome:
    """A run's end after an attempt: its status (``None``: given back to the queue),
    reason and one human sentence."""

    status: Status | None
    reason: str
    detail: str

    @property
    def released(self) -> bool:
        return self.status is None


def unknown_meta(keys: Iterable[str], error: str) -> dict[str, Any]:
    """What a caller's ``AsyncResult.info`` says while the run is UNKNOWN: the effects
    whose outcome is unknown, the error that left them so, and what resolves them."""
    return {
        "effects": sorted(keys),
        "error": error,
        "resolved_by": (
            "the workers' reconciler, which asks the task's reconciler for each effect; "
            "without one, an operator with evidence (admin: Effects, resolve)"
        ),
    }


def unresolved(keys: frozenset[str] | set[str], exc: BaseException | None = None) -> Outcome:
    """UNKNOWN is not FAILED: an effect of the attempt has no recorded outcome."""
    detail = f"outcome unknown for effect(s) {', '.join(sorted(keys))}"
    if exc is not None:
        detail += f" after {shown(exc, 500)}"
    return Outcome(Status.UNKNOWN, "effect_unresolved", detail[:2000])


def performed_note(performed: Mapping[str, str]) -> str | None:
    """What a failed run's error and record add when its effects were performed
    (``performed``: key -> effect name, this attempt's and those replayed from earlier
    ones): a failed order that was paid is never silent. ``None`` when none was."""
    if not performed:
        return None
    done = ", ".join(f"{name} ({key})" for key, name in sorted(performed.items()))
    return f"celery-deadlines: effects performed before this error: {done}"


def after_body(
    exc: BaseException,
    *,
    celery: CeleryEnd,
    unresolved_keys: frozenset[str] | set[str],
    performed: Mapping[str, str] | None = None,
) -> Outcome:
    """The run's end for a body that raised ``exc`` (``celery``: what Celery makes of it).

    An effect dispatched without a known outcome makes the run UNKNOWN whatever was
    raised: never FAILED, never released to run again. A run that fails or expires
    after effects were performed says which (:func:`performed_note`) in its detail.
    """
    outcome = _after_body(exc, celery=celery, unresolved_keys=unresolved_keys)
    note = note_for(outcome, performed or {})
    if note is None:
        return outcome
    return Outcome(outcome.status, outcome.reason, f"{outcome.detail}; {note}"[:2000])


#: How much of a failed body's traceback a run keeps (characters): the last ones, where
#: the innermost frames and the exception are; the outer frames cut are counted instead.
TRACEBACK_LIMIT: Final = 16_000


def bounded_traceback(text: str, limit: int = TRACEBACK_LIMIT) -> str:
    """A formatted traceback as the run keeps it: whole up to ``limit`` characters, else
    its last ``limit`` characters after a line saying how many were cut."""
    if len(text) <= limit:
        return text
    return f"[{len(text) - limit} characters of outer frames cut]\n{text[-limit:]}"


def note_for(outcome: Outcome, performed: Mapping[str, str]) -> str | None:
    """The :func:`performed_note` of a run that ends FAILED or EXPIRED, else ``None``."""
    if outcome.status not in (Status.FAILED, Status.EXPIRED):
        return None
    return performed_note(performed)


def _after_body(
    exc: BaseException, *, celery: CeleryEnd, unresolved_keys: frozenset[str] | set[str]
) -> Outcome:
    if unresolved_keys:
        return unresolved(unresolved_keys, exc)
    if celery == "ignore":
        return Outcome(Status.SUCCEEDED, "ignored", "the task raised Ignore")
    why = getattr(exc, "reason", None)
    if celery == "requeue":
        return Outcome(None, "", f"rejected with requeue: {why!r}")
    if celery == "reject":
        return Outcome(Status.FAILED, "rejected", f"rejected: {why!r}")
    if isinstance(exc, DeadlineRefused):
        return Outcome(Status.EXPIRED, exc.reason, str(exc))
    if isinstance(exc, PlanRefused):
        return Outcome(Status.FAILED, exc.reason, str(exc))
    if isinstance(exc, DispatchRefused):
        # another run's dispatch of the key is unresolved, or the guard refused for the
        # deadline or a stale lease (then this write is refused too: the reconciler
        # settles the run)
        return Outcome(Status.FAILED, "dispatch_refused", str(exc))
    return Outcome(Status.FAILED, "error", repr(exc)[:2000])


def needing_an_operator(
    effects: Mapping[str, str], has_reconciler: Callable[[str], bool]
) -> list[str]:
    """The keys of the unresolved ``effects`` (key -> effect name) that only a person can
    settle: no reconciler of the run's task answers for their name (the workers'
    reconciler asks the others, and pages nobody unless it cannot decide)."""
    return sorted(key for key, name in effects.items() if not has_reconciler(name))


#: A hard time limit that fires this close to the deadline was the deadline's cap.
DEADLINE_CAP_SLACK = timedelta(seconds=1)


def after_time_limit(
    deadline: datetime | None, now: datetime, *, delivery_task: bool = False
) -> tuple[Status, str]:
    """A pool process killed by its hard time limit: EXPIRED when the limit was the
    deadline's cap (the attempt gate), FAILED (``time_limit``) when it was the task's own."""
    if deadline is not None and now >= deadline - DEADLINE_CAP_SLACK:
        return Status.EXPIRED, expiry_reason(delivery_task=delivery_task).value
    return Status.FAILED, "time_limit"


#: The reasons of a run Celery itself ended in a worker (the ``task_revoked`` signal).
EXPIRED_BY_CELERY: Final = "expired_by_celery"
REVOKED_BY_CELERY: Final = "revoked_by_celery"


def ended_by_celery(
    *, expired: bool, terminated: bool, signum: object = None
) -> tuple[Status, str, str]:
    """A run Celery ended in a worker, as the ledger records it (status, reason,
    detail): its own ``expires`` passed (EXPIRED, ``expired_by_celery``: the caller was
    told ``TaskRevokedError``, and no deadline of the library's was involved), or it was
    revoked, or terminated while running (FAILED, ``revoked_by_celery``). What the
    caller was told stays."""
    if expired:
        return Status.EXPIRED, EXPIRED_BY_CELERY, "Celery discarded the message: its expires passed"
    if terminated:
        return (
            Status.FAILED,
            REVOKED_BY_CELERY,
            f"revoked and terminated by Celery (signal {signum})",
        )
    return Status.FAILED, REVOKED_BY_CELERY, "revoked: Celery discarded the message"


#: The reason Celery stores with a message its own ``expires`` check discarded
#: (``TaskRevokedError('expired')``, state ``REVOKED``).
CELERY_EXPIRED: Final = "expired"

#: The refusals for the deadline itself (not for a header, a retry or a person).
_FOR_THE_DEADLINE: Final = frozenset({Reason.DEADLINE_PASSED, Reason.INSUFFICIENT_BUDGET})


def told_as_celery_expiry(reason: str | None, source: str | None) -> bool:
    """Is a run refused or ended for its deadline told to its caller as Celery tells of a
    message its ``expires`` discarded (state ``REVOKED``, ``TaskRevokedError('expired')``,
    ``task-revoked`` with ``expired=True``)? When the governing deadline is Celery's
    ``expires`` (``source``: the message's ``x_deadline_source``) and the refusal is for
    that deadline (``reason``: it passed, or less than the reserve was left): a caller's
    ``except TaskRevokedError`` keeps catching it, and the ledger keeps the reason. Any
    other refusal is told as the typed refusal it is."""
    return source == "expires" and reason in _FOR_THE_DEADLINE


#: What a cancel's history line says before who cancelled (``cancelled by <who>: <why>``).
_CANCELLED_BY: Final = "cancelled by "


def cancel_detail(by: str, reason: str) -> str:
    """What each run a cancel changed keeps in its history: who cancelled it, and why."""
    return f"{_CANCELLED_BY}{by}: {reason}" if reason else f"{_CANCELLED_BY}{by}"


def cancel_of(detail: str) -> tuple[str, str]:
    """Who cancelled and why, read back from :func:`cancel_detail`'s words (who: up to
    the first ``": "``)."""
    by, _, reason = detail.removeprefix(_CANCELLED_BY).partition(": ")
    return by, reason


#: The reason Celery stores with a task it revoked (``TaskRevokedError('revoked')``,
#: state ``REVOKED``): what the caller of a cancelled run is told.
CELERY_REVOKED: Final = "revoked"


def celery_revocation(reason: str | None, source: str | None) -> str | None:
    """The reason a run refused or ended is told to its caller as Celery's ``REVOKED``
    (``TaskRevokedError(reason)``, ``task-revoked``), or ``None`` for the typed refusal:
    a cancelled run (``cancelled``: :func:`celery_deadlines.cancel`) is Celery's revoke
    (``revoked``), whatever its deadline's source, as Flower and django-celery-results
    show cancelled work; a refusal for a deadline that was Celery's ``expires`` is
    Celery's expiry (``expired``: :func:`told_as_celery_expiry`)."""
    if reason == Reason.CANCELLED:
        return CELERY_REVOKED
    if told_as_celery_expiry(reason, source):
        return CELERY_EXPIRED
    return None


class Settle(enum.Enum):
    """What the reconciler does with a run whose lease lapsed, in this order of priority."""

    #: a dispatch of the attempt has no recorded outcome: reconcile it before anything
    UNKNOWN = "unknown"
    #: past its deadline: ended, never resurrected
    EXPIRE = "expire"
    #: it lost too many leases (a task that kills its worker): failed, not looped
    FAIL = "fail"
    #: given back to the queue with a fresh token; the next claim resumes it
    REQUEUE = "requeue"


def settle_lapsed(
    *, unresolved_effect: bool, past_deadline: bool, lost_leases: int, max_lost: int
) -> Settle:
    """The order in which a lapsed run is settled (docs/explanation/run-ledger.md,
    reconciliation)."""
    if unresolved_effect:
        return Settle.UNKNOWN
    if past_deadline:
        return Settle.EXPIRE
    if lost_leases >= max_lost:
        return Settle.FAIL
    return Settle.REQUEUE


class PlanStep(enum.Enum):
    """What a run does after its stored plan was checked on resume."""

    CONTINUE = "continue"
    REVALIDATE = "revalidate"
    REFUSE = "refuse"
    PAUSE = "pause"
    ESCALATE = "escalate"


def after_plan(may_execute: bool, on_expiry: OnExpiry) -> PlanStep:
    """A plan that may go on continues; one that may not follows the contract."""
    if may_execute:
        return PlanStep.CONTINUE
    return PlanStep(on_expiry.value)
