"""The checker of the reliability tests (reliability plan 4.1 and 4.2), as a pure function.

It compares three records that no single component writes: what the driver planned and
was acknowledged, what the ledger says about each run, and what the provider's own
append-only log says happened. Effects are counted **only** from the provider's log;
the ledger is compared with it, never trusted for the count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Planned:
    """One run the driver asked for, and whether the producer was told it was sent."""

    task_id: str
    key: str
    point: str | None = None
    acknowledged: bool = True


@dataclass(frozen=True)
class Ledgered:
    """What the ledger says about one run (and its one effect, if it has one)."""

    status: str
    reason: str
    terminal: bool
    effect_state: str | None = None
    effect_token: int | None = None


@dataclass
class Verdict:
    """Each list names the runs (or keys) that break one invariant; all must be empty."""

    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    unexplained: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    unfired: list[str] = field(default_factory=list)

    def violations(self) -> dict[str, list[str]]:
        return {name: found for name, found in vars(self).items() if found}


def check(
    planned: Iterable[Planned],
    ledger: Mapping[str, Ledgered],
    calls: Iterable[Mapping[str, Any]],
    fired: Iterable[Mapping[str, Any]],
    allowed: frozenset[tuple[str, str]],
) -> Verdict:
    """Judge a quiesced system. ``calls`` are the provider's log lines (accepted ones
    count), ``fired`` the crash points that really fired, ``allowed`` the terminal
    (status, reason) pairs this scenario may end in."""
    planned = list(planned)
    accepted = [call for call in calls if call.get("outcome", "accepted") == "accepted"]
    per_key = Counter(call["key"] for call in accepted)
    token_of = {call["key"]: call["token"] for call in accepted}
    fired_points = Counter((entry["task_id"], entry["point"]) for entry in fired)
    verdict = Verdict()
    for run in planned:
        record = ledger.get(run.task_id)
        if record is None:
            if run.acknowledged:
                verdict.lost.append(run.task_id)
        elif not record.terminal:
            verdict.stuck.append(run.task_id)
        elif (record.status, record.reason) not in allowed:
            verdict.unexplained.append(f"{run.task_id}: {record.status} {record.reason!r}")
        count = per_key[run.key]
        if count > 1:
            verdict.duplicated.append(f"{run.key}: {count} calls")
        if record is not None and record.terminal:
            succeeded = record.status == "SUCCEEDED"
            if succeeded and (count != 1 or record.effect_state != "SUCCEEDED"):
                verdict.mismatched.append(
                    f"{run.task_id}: SUCCEEDED with {count} call(s), effect {record.effect_state}"
                )
            elif succeeded and record.effect_token != token_of[run.key]:
                verdict.mismatched.append(
                    f"{run.task_id}: effect token {record.effect_token}, "
                    f"the provider was called with {token_of[run.key]}"
                )
            elif not succeeded and count and record.effect_state != "SUCCEEDED":
                verdict.mismatched.append(
                    f"{run.task_id}: {record.status} but the provider took {count} call(s)"
                )
        if run.point is not None and fired_points[(run.task_id, run.point)] != 1:
            verdict.unfired.append(f"{run.task_id}@{run.point}")
    keys = {run.key for run in planned}
    verdict.unexpected = sorted(key for key in per_key if key not in keys)
    return verdict
