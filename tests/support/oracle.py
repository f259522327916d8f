"""The checker of the reliability tests (reliability plan 4.1 and 4.2), as a pure function.

It compares three records that no single component writes: what the driver planned and
was acknowledged, what the ledger says about each run, and what the provider's own
append-only log says happened. Effects are counted **only** from the provider's log;
the ledger is compared with it, never trusted for the count.

The nemesis soak (``tests/chaos``) adds what a caller sees (``callers``: the state of
each run's ``AsyncResult``), each run's deadline and the instants its claims were
committed: a provider call after the deadline's cap *overran*, a call under a token the
ledger had already superseded was a *stale write accepted*, and a caller told otherwise
than the ledger *disagrees*.
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
    #: the terminal (status, reason) pairs this run may end in (None: the scenario's)
    allowed: frozenset[tuple[str, str]] | None = None


@dataclass(frozen=True)
class Ledgered:
    """What the ledger says about one run (and its one effect, if it has one)."""

    status: str
    reason: str
    terminal: bool
    effect_state: str | None = None
    effect_token: int | None = None
    #: the run's deadline (POSIX seconds), if it has one
    deadline: float | None = None
    #: (token, POSIX seconds by the database clock) of every claim the ledger applied
    claims: tuple[tuple[int, float], ...] = ()


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
    overran: list[str] = field(default_factory=list)
    stale_accepted: list[str] = field(default_factory=list)
    disagreeing: list[str] = field(default_factory=list)

    def violations(self) -> dict[str, list[str]]:
        return {name: found for name, found in vars(self).items() if found}


def check(
    planned: Iterable[Planned],
    ledger: Mapping[str, Ledgered],
    calls: Iterable[Mapping[str, Any]],
    fired: Iterable[Mapping[str, Any]],
    allowed: frozenset[tuple[str, str]],
    *,
    callers: Mapping[str, str] | None = None,
    cap_slack: float = 1.5,
    stale_grace: float = 0.25,
) -> Verdict:
    """Judge a quiesced system. ``calls`` are the provider's log lines (accepted ones
    count), ``fired`` the crash points that really fired, ``allowed`` the terminal
    (status, reason) pairs this scenario may end in (a run's own ``allowed`` wins; an
    allowed ``UNKNOWN`` is not stuck: it waits for a person, with its reason).

    ``callers`` maps task ids to the state their caller's ``AsyncResult`` shows
    (``SUCCESS``, ``FAILURE``, ``UNKNOWN``...): it must say what the ledger says. A call
    later than ``cap_slack`` seconds after its run's deadline overran the deadline's
    cap; a call under a token whose successor's claim was committed ``stale_grace``
    seconds before it arrived was a stale write the provider accepted."""
    planned = list(planned)
    accepted = [call for call in calls if call.get("outcome", "accepted") == "accepted"]
    per_key = Counter(call["key"] for call in accepted)
    token_of = {call["key"]: call["token"] for call in accepted}
    fired_points = Counter((entry["task_id"], entry["point"]) for entry in fired)
    verdict = Verdict()
    for run in planned:
        record = ledger.get(run.task_id)
        explained = run.allowed if run.allowed is not None else allowed
        if record is None:
            if run.acknowledged:
                verdict.lost.append(run.task_id)
        elif not record.terminal and (record.status, record.reason) not in explained:
            verdict.stuck.append(run.task_id)
        elif (record.status, record.reason) not in explained:
            verdict.unexplained.append(f"{run.task_id}: {record.status} {record.reason!r}")
        if record is not None:
            judge_history(
                run,
                record,
                [c for c in accepted if c["key"] == run.key],
                verdict,
                cap_slack,
                stale_grace,
            )
            if callers is not None and (record.terminal or record.status == "UNKNOWN"):
                told = callers.get(run.task_id, "PENDING")
                expected = CALLER_SEES.get(record.reason) or CALLER_SEES.get(record.status)
                if told != (expected or record.status):
                    verdict.disagreeing.append(
                        f"{run.task_id}: the ledger says {record.status}, the caller {told}"
                    )
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


#: What a caller's ``AsyncResult.state`` must be for each state the ledger ends a run in.
#: (``publish_failed``, ``queue_backlog``: ``apply_async`` raised, nothing was sent or
#: stored: ``PENDING``.)
CALLER_SEES = {
    "SUCCEEDED": "SUCCESS", "FAILED": "FAILURE", "EXPIRED": "FAILURE",
    "publish_failed": "PENDING", "queue_backlog": "PENDING",
}  # fmt: skip


def judge_history(
    run: Planned,
    record: Ledgered,
    accepted: list[Mapping[str, Any]],
    verdict: Verdict,
    cap_slack: float,
    stale_grace: float,
) -> None:
    """The provider's accepted calls for one run against its deadline and its claims."""
    for call in accepted:
        at = call.get("t")
        if at is None:
            continue
        if record.deadline is not None and at > record.deadline + cap_slack:
            late = at - record.deadline
            verdict.overran.append(
                f"{run.task_id}: {run.key} called {late:.2f} s past the deadline"
            )
        superseded = [
            (token, claimed)
            for token, claimed in record.claims
            if token > call["token"] and claimed + stale_grace < at
        ]
        if superseded:
            token, claimed = min(superseded)
            verdict.stale_accepted.append(
                f"{run.task_id}: {run.key} accepted under token {call['token']} "
                f"{at - claimed:.2f} s after token {token} was claimed"
            )
