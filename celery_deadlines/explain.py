"""``explain``: the operator checklist of docs/concepts.md, answered for one run.

Which worker owns this run now? When does that lease expire, in UTC? Which version did
it claim? What was the last durable checkpoint? Can an old worker still pass the guard?
Every answer comes from the ledger (the run row and its event history) and the
database clock; ``manage.py deadlines explain TASK_ID`` prints it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from .models import Effect, EffectState, Run, RunEvent


def facts(
    run: Run, events: list[RunEvent], effects: list[Effect], database_now: datetime
) -> dict[str, Any]:
    """The checklist's answers as plain values (what ``explain --json`` prints)."""
    claims = [e for e in events if e.kind == "claim" and e.outcome == RunEvent.Outcome.APPLIED]
    current_claim = next((e for e in reversed(claims) if e.lease_token == run.lease_token), None)
    rejected = [e for e in events if e.outcome == RunEvent.Outcome.REJECTED]
    live = run.lease_expires_at is not None and run.lease_expires_at > database_now
    planned = [e for e in effects if e.state in (EffectState.INTENT_RECORDED,)]
    dispatched = [e for e in effects if e.state == EffectState.DISPATCHED]
    unknown = [e for e in effects if e.state == EffectState.UNKNOWN]
    return {
        "task_id": run.task_id,
        "task_name": run.task_name,
        "status": run.status,
        "reason": run.reason,
        "detail": run.detail,
        "deadline": utc(run.deadline) if run.deadline else None,
        "database_clock": utc(database_now),
        "owner": run.owner if live else None,
        "lease_expires_at": utc(run.lease_expires_at) if run.lease_expires_at else None,
        "lease_live": live,
        "fencing_token": run.lease_token,
        "claimed_version": current_claim.version if current_claim else None,
        "claimed_at": utc(current_claim.at) if current_claim else None,
        "version": run.version,
        "attempts": run.attempt,
        "lost_leases": run.lost_leases,
        "last_checkpoint": (
            {
                "name": run.checkpoint_name,
                "at": utc(run.checkpoint_at),
                "token": run.checkpoint_token,
                "data": run.checkpoint_data,
            }
            if run.checkpoint_name
            else None
        ),
        "writes_allowed_for_token": run.lease_token if live else None,
        "stale_writes_refused": [
            {"kind": e.kind, "owner": e.owner, "token": e.lease_token, "at": utc(e.at)}
            for e in rejected
        ],
        "next_effect": (
            {"key": dispatched[-1].key, "state": "dispatched"}
            if dispatched
            else {"key": planned[-1].key, "state": "planned"}
            if planned
            else None
        ),
        "unknown_effects": [
            {"key": e.key, "error": e.error, "evidence": e.evidence} for e in unknown
        ],
        "effects": [
            {
                "key": e.key,
                "name": e.name,
                "kind": e.kind,
                "state": e.state,
                "token": e.lease_token,
                "dispatches": e.dispatches,
                "evidence": e.evidence,
            }
            for e in effects
        ],
        "root_id": run.root_id,
        "parent_id": run.parent_id,
        "occurrence": (
            {
                "schedule": run.schedule,
                "zone": run.schedule_zone,
                "local": run.schedule_local,
                "not_before": utc(run.not_before),
            }
            if run.schedule
            else None
        ),
        "plans": [
            {"plan_id": p.plan_id, "state": p.state, "reason": p.reason, "detail": p.detail}
            for p in run.plans.order_by("id")
        ],
    }


def explain(
    run: Run, events: list[RunEvent], database_now: datetime, effects: list[Effect] | None = None
) -> list[str]:
    """The checklist for ``run`` as lines of text (``events`` oldest first)."""
    f = facts(run, events, effects or [], database_now)
    why = f" ({run.reason}: {run.detail})" if run.reason else ""
    claimed = "-"
    if f["claimed_version"] is not None:
        claimed = f"{f['claimed_version']} (claim at {f['claimed_at']})"
    checkpoint = f["last_checkpoint"]
    rejected = f["stale_writes_refused"]
    next_effect = f["next_effect"]
    lines = [
        f"run {run.task_id} ({run.task_name})",
        f"  status            {run.status}{why}",
        f"  deadline          {utc(run.deadline)}{_relative(run.deadline, database_now)}",
        f"  database clock    {utc(database_now)}",
        f"  owner now         {f['owner'] or 'nobody (no live lease)'}",
        f"  lease expires     {utc(run.lease_expires_at)}",
        f"  fencing token     {run.lease_token}",
        f"  claimed version   {claimed}",
        f"  version now       {run.version}",
        f"  attempts          {run.attempt} claim(s), {run.lost_leases} lease(s) lost",
        "  last checkpoint   "
        + (
            f"{checkpoint['name']!r} at {checkpoint['at']} under token {checkpoint['token']}: "
            f"{json.dumps(checkpoint['data'])}"
            if checkpoint
            else "none"
        ),
        "  old worker guard  "
        + (
            f"only token {run.lease_token} may write or dispatch, until {utc(run.lease_expires_at)}"
            if f["lease_live"]
            else "no token may write or dispatch: no live lease"
        ),
        f"  stale writes      {len(rejected)} refused"
        + (
            ": "
            + ", ".join(f"{e['kind']} by {e['owner']} (token {e['token']})" for e in rejected[-3:])
            if rejected
            else ""
        ),
        "  next effect       "
        + (f"{next_effect['key']}: {next_effect['state']}" if next_effect else "none pending"),
        "  unknown outcomes  "
        + (
            "; ".join(
                f"{e['key']} ({e['error'] or 'no error recorded'}): reconcile with the "
                "provider (task reconciler or admin)"
                for e in f["unknown_effects"]
            )
            or "none"
        ),
        f"  family            root {run.root_id or '-'}, parent {run.parent_id or '-'}",
    ]
    occurrence = f["occurrence"]
    if occurrence is not None:
        lines.append(
            f"  occurrence        {occurrence['schedule']}: {occurrence['local']} "
            f"{occurrence['zone']} = {occurrence['not_before']}, window until "
            f"{utc(run.deadline)}"
        )
    for plan in f["plans"]:
        why = f" ({plan['reason']}: {plan['detail']})" if plan["reason"] else ""
        lines.append(f"  plan              {plan['plan_id'] or '-'} {plan['state']}{why}")
    if f["effects"]:
        lines += ["", "  effects:"]
        lines += [
            f"    {e['key']}  {e['state']:<15} t{e['token']:<3} dispatched {e['dispatches']}x"
            + (f"  evidence: {json.dumps(e['evidence'])}" if e["evidence"] is not None else "")
            for e in f["effects"]
        ]
    lines += ["", "  history (database clock):"]
    for event in events:
        lines.append(
            f"    {utc(event.at)}  {event.kind:<12} {event.outcome:<8} {event.status:<9} "
            f"v{event.version:<4} t{event.lease_token:<3} {event.owner or '-'}"
            + (f"  {event.detail}" if event.detail else "")
        )
    return lines


def utc(instant: datetime | None) -> str:
    """An instant as the operator reads it: ISO 8601 in UTC, to the millisecond."""
    if instant is None:
        return "-"
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _relative(instant: datetime | None, now: datetime) -> str:
    if instant is None:
        return "(no deadline)"
    seconds = (instant - now).total_seconds()
    return f" ({seconds:.1f} s left)" if seconds >= 0 else f" (passed {-seconds:.1f} s ago)"
