"""``explain``: the operator checklist of seed 000, answered for one run.

Which worker owns this run now? When does that lease expire, in UTC? Which version did
it claim? What was the last durable checkpoint? Can an old worker still pass the guard?
Every answer comes from the ledger (the run row and its event history) and the
database clock; ``manage.py deadlines explain TASK_ID`` prints it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from .models import Run, RunEvent


def explain(run: Run, events: list[RunEvent], database_now: datetime) -> list[str]:
    """The checklist for ``run`` as lines of text (``events`` oldest first)."""
    claims = [e for e in events if e.kind == "claim" and e.outcome == RunEvent.Outcome.APPLIED]
    current_claim = next((e for e in reversed(claims) if e.lease_token == run.lease_token), None)
    rejected = [e for e in events if e.outcome == RunEvent.Outcome.REJECTED]
    live = run.lease_expires_at is not None and run.lease_expires_at > database_now
    why = f" ({run.reason}: {run.detail})" if run.reason else ""
    claimed = (
        f"{current_claim.version} (claim at {utc(current_claim.at)})" if current_claim else "-"
    )
    lines = [
        f"run {run.task_id} ({run.task_name})",
        f"  status            {run.status}{why}",
        f"  deadline          {utc(run.deadline)}{_relative(run.deadline, database_now)}",
        f"  database clock    {utc(database_now)}",
        f"  owner now         {run.owner if live else 'nobody (no live lease)'}",
        f"  lease expires     {utc(run.lease_expires_at)}",
        f"  fencing token     {run.lease_token}",
        f"  claimed version   {claimed}",
        f"  version now       {run.version}",
        f"  attempts          {run.attempt} claim(s), {run.lost_leases} lease(s) lost",
        "  last checkpoint   "
        + (
            f"{run.checkpoint_name!r} at {utc(run.checkpoint_at)} under token "
            f"{run.checkpoint_token}: {json.dumps(run.checkpoint_data)}"
            if run.checkpoint_name
            else "none"
        ),
        "  old worker guard  "
        + (
            f"only token {run.lease_token} may write, until {utc(run.lease_expires_at)}"
            if live
            else "no token may write: no live lease"
        ),
        f"  stale writes      {len(rejected)} refused"
        + (": " + ", ".join(f"{e.kind} by {e.owner} (token {e.lease_token})" for e in rejected[-3:])
           if rejected else ""),
        f"  family            root {run.root_id or '-'}, parent {run.parent_id or '-'}",
        "",
        "  history (database clock):",
    ]  # fmt: skip
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
