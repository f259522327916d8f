"""The explanation of one run, built once from its rows in the ledger and one reading of
the database clock (:func:`facts`; :func:`explanation_of` reads them). No I/O here but
through :func:`explanation_of`; the text and the JSON are both rendered from the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from ..models import Effect, Run, RunEvent, RunPlan
from ..rules.states import TERMINAL, UNRESOLVED, EffectState, Status
from .shape import (
    Checkpoint,
    Child,
    EffectFacts,
    Ended,
    Event,
    Explanation,
    NextEffect,
    Occurrence,
    PlanFacts,
    Refused,
    Replay,
    UnknownEffect,
    instant,
    seconds,
    utc,
)

#: The writes that publish the run's recorded message again, and who makes them.
REPLAYED_BY = {
    "republish": "the sweeper: unclaimed after deadlines_republish_after",
    "requeue": "the reconciler: its lease lapsed",
    "reconciled": "the reconciler: its effects were resolved",
    "requeue_now": "an operator",
}


def explanation_of(task_id: str, using: str = "default") -> Explanation | None:
    """Read run ``task_id`` from the ledger on ``using`` (with its events, effects, plans
    and children) and explain it by the database clock; ``None`` if there is no such run."""
    from ..ledger.sql.connection import Store

    run = Run.objects.using(using).filter(task_id=task_id).first()
    if run is None:
        return None
    return facts(
        run,
        events=list(run.events.using(using).order_by("id")),
        effects=list(run.effects.using(using).order_by("id")),
        plans=list(run.plans.using(using).order_by("id")),
        children=list(Run.objects.using(using).filter(parent_id=task_id).order_by("id")),
        database_now=Store(using).database_now(),  # read last: no row is younger
    )


def facts(
    run: Run,
    *,
    events: Sequence[RunEvent],
    effects: Sequence[Effect] = (),
    plans: Sequence[RunPlan] = (),
    children: Sequence[Run] = (),
    database_now: datetime,
) -> Explanation:
    """The checklist's answers for ``run`` as plain values (``events`` oldest first)."""
    applied = [e for e in events if e.outcome == RunEvent.Outcome.APPLIED]
    claims = [e for e in applied if e.kind == "claim"]
    current_claim = next((e for e in reversed(claims) if e.lease_token == run.lease_token), None)
    live = run.lease_expires_at is not None and run.lease_expires_at > database_now
    planned = [e for e in effects if e.state == EffectState.INTENT_RECORDED]
    dispatched = [e for e in effects if e.state == EffectState.DISPATCHED]
    ended = _ended(run, applied, claims[0].at if claims else None)
    left = None
    if ended is None and run.deadline is not None:
        left = seconds(run.deadline - database_now)
    return {
        "task_id": run.task_id,
        "task_name": run.task_name,
        "status": run.status,
        "reason": run.reason,
        "detail": run.detail,
        "database_clock": utc(database_now),
        "created_at": utc(run.created_at),
        "deadline": instant(run.deadline),
        "delivery_deadline": instant(run.delivery_deadline),
        "delivery_task": run.delivery_task,
        "time_left_seconds": left,
        "ended": ended,
        "next_step": next_step(run, effects, live=live, time_left=left),
        "owner": run.owner if live else None,
        "lease_expires_at": instant(run.lease_expires_at),
        "lease_live": live,
        "fencing_token": run.lease_token,
        "claimed_version": current_claim.version if current_claim else None,
        "claimed_at": instant(current_claim.at) if current_claim else None,
        "version": run.version,
        "attempts": run.attempt,
        "lost_leases": run.lost_leases,
        "last_checkpoint": (
            Checkpoint(
                name=run.checkpoint_name,
                at=instant(run.checkpoint_at),
                token=run.checkpoint_token,
                data=run.checkpoint_data,
            )
            if run.checkpoint_name
            else None
        ),
        "writes_allowed_for_token": run.lease_token if live else None,
        "stale_writes_refused": [
            Refused(kind=e.kind, owner=e.owner, token=e.lease_token, at=_at(e), detail=e.detail)
            for e in events
            if e.outcome == RunEvent.Outcome.REJECTED
        ],
        "next_effect": (
            NextEffect(key=dispatched[-1].key, state="dispatched")
            if dispatched
            else NextEffect(key=planned[-1].key, state="planned")
            if planned
            else None
        ),
        "unknown_effects": [
            UnknownEffect(key=e.key, error=e.error, evidence=e.evidence)
            for e in effects
            if e.state == EffectState.UNKNOWN
        ],
        "effects": [_effect(e) for e in effects],
        "root_id": run.root_id,
        "parent_id": run.parent_id,
        "children": [
            Child(task_id=c.task_id, task_name=c.task_name, status=c.status, reason=c.reason)
            for c in children
        ],
        "occurrence": (
            Occurrence(
                schedule=run.schedule,
                zone=run.schedule_zone,
                local=run.schedule_local,
                not_before=instant(run.not_before),
            )
            if run.schedule
            else None
        ),
        "plans": [
            PlanFacts(
                plan_id=p.plan_id,
                state=p.state,
                reason=p.reason,
                detail=p.detail,
                created_at=utc(p.created_at),
                ended_at=instant(p.ended_at),
            )
            for p in plans
        ],
        "replays": [
            Replay(
                at=_at(e),
                kind=e.kind,
                by=REPLAYED_BY[e.kind],
                status=e.status,
                token=e.lease_token,
                detail=e.detail,
            )
            for e in applied
            if e.kind in REPLAYED_BY and e.status not in TERMINAL
        ],
        "history": [_event(e) for e in events],
    }


def next_step(run: Run, effects: Sequence[Effect], *, live: bool, time_left: float | None) -> str:
    """What moves the run next, in a sentence (for UNKNOWN: what resolves it)."""
    status = run.status
    if status == Status.SUCCEEDED:
        return "none: it succeeded (final)"
    if status == Status.EXPIRED:
        return "none: it expired (final)"
    if status == Status.FAILED:
        return "none: it failed (an operator may requeue it while its deadline allows)"
    if status == Status.UNKNOWN:
        open_keys = [e.key for e in effects if e.state in UNRESOLVED]
        then = "then it is queued again, or EXPIRED if its deadline has passed"
        if not open_keys:
            return f"its effects are resolved: the next reconcile pass releases it; {then}"
        return (
            f"an answer for {', '.join(open_keys)}: the task's effect reconciler asks the "
            "provider on the next reconcile pass, or an operator resolves it with evidence "
            f"(admin: effects, Resolve an unknown outcome); {then}"
        )
    if status == Status.RUNNING:
        if live:
            return f"its owner {run.owner} ends it; if its lease lapses, the reconciler settles it"
        return "the next reconcile pass settles its lapsed lease"
    if time_left is not None and time_left <= 0:
        return "the next reconcile pass expires it: its deadline has passed"
    if status == Status.PAUSED:
        return "a person: requeue it in the admin, or its deadline expires it"
    if status == Status.CLOCK_UNCERTAIN:
        return "a worker whose clock agrees with the database's publishes it again"
    return "a worker's claim (the sweeper republishes it if it waits too long)"


def _ended(run: Run, applied: Sequence[RunEvent], first_claim: datetime | None) -> Ended | None:
    """When ``run`` reached its final status: the last applied event that moved it into
    one (the last write if the history is not given)."""
    if run.status not in TERMINAL:
        return None
    at: datetime = run.updated_at
    before: str | None = None
    for event in applied:
        if event.status in TERMINAL and before not in TERMINAL:
            at = event.at
        before = event.status
    return Ended(
        at=utc(at),
        ran_seconds=None if first_claim is None else seconds(at - first_claim),
        after_enqueue_seconds=seconds(at - run.created_at),
        before_deadline_seconds=None if run.deadline is None else seconds(run.deadline - at),
    )


def _event(e: RunEvent) -> Event:
    return Event(
        at=_at(e),
        kind=e.kind,
        outcome=e.outcome,
        status=e.status,
        reason=e.reason,
        version=e.version,
        token=e.lease_token,
        owner=e.owner,
        lease_expires_at=instant(e.lease_expires_at),
        detail=e.detail,
    )


def _effect(e: Effect) -> EffectFacts:
    return EffectFacts(
        key=e.key,
        name=e.name,
        kind=e.kind,
        state=e.state,
        token=e.lease_token,
        dispatches=e.dispatches,
        dispatched_at=instant(e.dispatched_at),
        error=e.error,
        evidence=e.evidence,
    )


def _at(event: RunEvent) -> str:
    return utc(event.at)
