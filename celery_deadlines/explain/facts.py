"""The explanation of one run, built once from its rows in the ledger and one reading of
the database clock (:func:`facts`; :func:`explanation_of` reads them). No I/O here but
through :func:`explanation_of`; the text and the JSON are both rendered from the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from ..models import Effect, Run, RunEvent, RunPlan
from ..rules import limits
from ..rules.outcomes import PERFORMED_PAST_DEADLINE, cancel_of
from ..rules.states import TERMINAL, UNRESOLVED, EffectState, Status
from .shape import (
    Cancelled,
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
    TimeLimits,
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


#: What the operator may have copied with a short id from the admin's list: its ellipsis.
ELLIPSES = ("…", "...")
#: The longest task id the ledger's column keeps: a longer text is the start of none
#: (and SQLite refuses a ``LIKE`` pattern of 50,000 bytes: it is never asked one).
LONGEST_ID = 255


def typed_id(text: str) -> str:
    """An id as the operator has it, as it is looked up: without the space around it,
    nor the ellipsis of a short id copied from the admin's list (``3f2a4c1e…``)."""
    given = text.strip()
    for ellipsis in ELLIPSES:
        given = given.removesuffix(ellipsis)
    return given.strip()


def task_ids_named(given: str, using: str = "default", most: int = 5) -> list[str]:
    """The task ids ``given`` names: itself if a run has it (a whole id is never
    ambiguous, even when it starts another), else the ids of the runs whose task id
    starts with it (:func:`typed_id`), in order, at most ``most`` + 1 (more than
    ``most``: there are more). One probe of the task id's index either way."""
    given = typed_id(given)
    runs = Run.objects.using(using)
    if not given:
        return []
    if runs.filter(task_id=given).exists():
        return [given]
    if len(given) > LONGEST_ID:
        return []
    starting = runs.filter(task_id__startswith=given).order_by("task_id")
    return list(starting.values_list("task_id", flat=True)[: most + 1])


def explanation_of(task_id: str, using: str = "default") -> Explanation | None:
    """Read run ``task_id`` from the ledger on ``using`` (with its events, effects, plans
    and children) and explain it by the database clock; ``None`` if there is no such run."""
    from ..ledger.sql.connection import Store

    run = Run.objects.using(using).filter(task_id=task_id).first()
    if run is None:
        return None
    events = list(run.events.using(using).order_by("id"))
    cancel = last_cancel(events)
    return facts(
        run,
        events=events,
        effects=list(run.effects.using(using).order_by("id")),
        plans=list(run.plans.using(using).order_by("id")),
        children=list(Run.objects.using(using).filter(parent_id=task_id).order_by("id")),
        running_at_cancel=[] if cancel is None else running_at(cancel, run.root_id, using),
        database_now=Store(using).database_now(),  # read last: no row is younger
    )


#: How far apart the events of one cancel's statement are, at most (the time it takes).
ONE_STATEMENT = timedelta(minutes=1)


def last_cancel(events: Sequence[RunEvent]) -> RunEvent | None:
    """The applied event of the last cancel that reached the run, if any."""
    cancels = [e for e in events if e.kind == "cancel" and e.outcome == RunEvent.Outcome.APPLIED]
    return cancels[-1] if cancels else None


def running_at(cancel: RunEvent, root_id: str, using: str) -> list[str]:
    """The runs of the tree under ``root_id`` that were RUNNING when ``cancel`` reached
    them: the one statement of a cancel writes each run's event with the same words,
    each at the database clock's reading as it went (within :data:`ONE_STATEMENT`)."""
    if not root_id:  # a run recorded with no root: its own tree
        return [cancel.run.task_id] if cancel.status == Status.RUNNING else []
    return list(
        RunEvent.objects.using(using)
        .filter(
            run__root_id=root_id,
            kind="cancel",
            at__range=(cancel.at - ONE_STATEMENT, cancel.at + ONE_STATEMENT),
            detail=cancel.detail,
            status=Status.RUNNING,
        )
        .order_by("id")
        .values_list("run__task_id", flat=True)
    )


def facts(
    run: Run,
    *,
    events: Sequence[RunEvent],
    effects: Sequence[Effect] = (),
    plans: Sequence[RunPlan] = (),
    children: Sequence[Run] = (),
    running_at_cancel: Sequence[str] = (),
    database_now: datetime,
) -> Explanation:
    """The checklist's answers for ``run`` as plain values (``events`` oldest first)."""
    applied = [e for e in events if e.outcome == RunEvent.Outcome.APPLIED]
    claims = [e for e in applied if e.kind == "claim"]
    current_claim = next((e for e in reversed(claims) if e.lease_token == run.lease_token), None)
    # a released run (its token moved on) was last claimed all the same
    claim = current_claim or (claims[-1] if claims else None)
    live = run.lease_expires_at is not None and run.lease_expires_at > database_now
    planned = [e for e in effects if e.state == EffectState.INTENT_RECORDED]
    dispatched = [e for e in effects if e.state == EffectState.DISPATCHED]
    runtime = running_time(applied, database_now)
    ended = _ended(run, applied, runtime)
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
        "cancelled": _cancelled(last_cancel(events), effects, running_at_cancel),
        "next_step": next_step(run, effects, live=live, time_left=left),
        "owner": run.owner if live else None,
        "last_owner": (claims[-1].owner or None) if claims else None,
        "lease_expires_at": instant(run.lease_expires_at),
        "lease_live": live,
        "fencing_token": run.lease_token,
        "claimed_version": claim.version if claim else None,
        "claimed_at": instant(claim.at) if claim else None,
        "claimed_token": claim.lease_token if claim else None,
        "started_at": instant(claims[0].at) if claims else None,
        "runtime_seconds": None if runtime is None else seconds(runtime),
        "time_limits": [_limits(run, n, claim) for n, claim in enumerate(claims, 1)],
        "traceback": run.traceback,
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
    if status == Status.EXPIRED and run.reason == PERFORMED_PAST_DEADLINE:
        return (
            "none: it expired after its side effect was performed (final); the task's "
            "work after the effect did not run"
        )
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


def running_time(applied: Sequence[RunEvent], now: datetime) -> timedelta | None:
    """How long the run was RUNNING, by its applied events (oldest first), summed over
    its attempts: a run that waited UNKNOWN for an operator did not run meanwhile. A
    run RUNNING at its last event counts up to ``now``. ``None``: never claimed."""
    total, since, claimed = timedelta(0), None, False
    for event in applied:
        running = event.status == Status.RUNNING
        if running and since is None:
            since, claimed = event.at, True
        elif not running and since is not None:
            total += event.at - since
            since = None
    if since is not None:
        total += max(now - since, timedelta(0))
    return total if claimed else None


def _limits(run: Run, attempt: int, claim: RunEvent) -> TimeLimits:
    """The time limits the attempt of ``claim`` was given, as its claim recorded them
    (:func:`~celery_deadlines.rules.limits.read_claim`), or what can be said of a claim
    that recorded none: the time the deadline left then."""
    recorded = limits.read_claim(claim.detail)
    hard = soft = limits.NO_LIMIT
    if recorded is not None:
        hard, soft = recorded.hard, recorded.soft
    return TimeLimits(
        attempt=attempt,
        at=utc(claim.at),
        token=claim.lease_token,
        recorded=recorded is not None,
        eager=recorded is not None and recorded.eager,
        hard_seconds=_rounded(hard.seconds),
        hard_set_by=hard.source,
        hard_celery_seconds=_rounded(hard.instead),
        hard_celery_set_by=hard.instead_source,
        soft_seconds=_rounded(soft.seconds),
        soft_set_by=soft.source,
        soft_celery_seconds=_rounded(soft.instead),
        soft_celery_set_by=soft.instead_source,
        deadline_left_seconds=None if run.deadline is None else seconds(run.deadline - claim.at),
    )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _ended(run: Run, applied: Sequence[RunEvent], runtime: timedelta | None) -> Ended | None:
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
        ran_seconds=None if runtime is None else seconds(runtime),
        after_enqueue_seconds=seconds(at - run.created_at),
        before_deadline_seconds=None if run.deadline is None else seconds(run.deadline - at),
    )


def _cancelled(
    cancel: RunEvent | None, effects: Sequence[Effect], running: Sequence[str]
) -> Cancelled | None:
    """What :class:`~.shape.Cancelled` says of ``cancel`` (``None``: never cancelled)."""
    if cancel is None:
        return None
    by, reason = cancel_of(cancel.detail)
    ran = cancel.status == Status.RUNNING
    return Cancelled(
        at=_at(cancel),
        by=by,
        reason=reason,
        status_then=cancel.status,
        owner_then=(cancel.owner or None) if ran else None,
        token_then=cancel.lease_token if ran else None,
        effects_dispatched_by_then=[
            e.key for e in effects if e.dispatched_at is not None and e.dispatched_at <= cancel.at
        ],
        running_in_its_tree_then=list(running),
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
