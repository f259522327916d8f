"""The effect ledger's statements: intent, the dispatch guard, outcomes, reconciliation.

At most one side effect per key. The guard is one conditional write, evaluated against
the database clock, immediately before the external call: the effect moves
INTENT_RECORDED (or NOT_DISPATCHED) -> DISPATCHED only if the caller's run is RUNNING
under the caller's token, its lease is alive and its deadline has not passed. Zero rows:
the call must not be made. Every change of an effect appends a RunEvent through the
audit trigger (kind ``effect_<state>``).

Each statement's text is in ``effects.sql``, under its name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from ...rules import outcomes
from .rows import Lease, from_json
from .statements import Sql, Statements, queries


@dataclass(frozen=True)
class Recorded:
    """An effect as the intent statement found or made it."""

    state: str
    fingerprint: str
    result: Any
    lease_token: int


@dataclass(frozen=True)
class Pending:
    """An unresolved effect of a run waiting for reconciliation, as it was read.

    ``state``, ``dispatches`` (the key's dispatch number), ``lease_token`` and ``run_id``
    say *which* dispatch was asked about: a settlement applies only while the effect is
    still exactly that (:meth:`Effects.settle`).
    """

    key: str
    name: str
    fingerprint: str
    lease_token: int
    run_id: int
    task_id: str
    task_name: str
    state: str = "UNKNOWN"
    dispatches: int = 1

    def describe(self) -> str:
        return (
            f"dispatch {self.dispatches} ({self.state}, run {self.run_id}, token "
            f"{self.lease_token})"
        )


@dataclass(frozen=True)
class Released:
    """What releasing an UNKNOWN run whose effects are resolved wrote: queued again, or
    past its deadline EXPIRED (``deadline_passed``, or ``performed_past_deadline`` when
    an effect of it was performed), with its deadline and the detail it ended with."""

    status: str
    reason: str
    deadline: datetime | None
    detail: str


@dataclass(frozen=True)
class Settlement:
    """What :meth:`Effects.settle` did: ``applied``, or why not (``detail``)."""

    applied: bool
    detail: str = ""


class Effects(Statements):
    """The effect statements, on a :class:`Store`'s connection and dialect."""

    def record_intent(
        self, lease: Lease, key: str, name: str, kind: str, fingerprint: str
    ) -> Recorded:
        """Record the intent to perform ``key`` (or find it recorded): one statement.
        Finding it recorded marks it asked for (``asked_at``): the purge keeps an
        effect asked for within the retention, whichever run asked."""
        _, rows = self.store.execute(
            RECORD_INTENT.text[self.store.dialect.vendor],
            [key, lease.run_id, name, kind, lease.token, fingerprint],
        )
        state, recorded_fingerprint, result, token = rows[0]
        return Recorded(state, recorded_fingerprint, from_json(result), token)

    def dispatch(self, lease: Lease, key: str, fresh_until: datetime | None = None) -> int | None:
        """The dispatch guard: one conditional write. Returns the key's dispatch number
        (1, 2, ...: a fencing token per key), or ``None``: do not call out.

        ``fresh_until``: the earliest expiry of the evidence the effect relies on; the
        database clock must not have reached it either.
        """
        d = self.store.dialect
        # the effect's new token and run, its key, then the run's fence (id, token, owner)
        fence = [lease.run_id, lease.token, lease.owner]
        params: list[Any] = [lease.token, lease.run_id, key, *fence]
        if fresh_until is None:  # no evidence: no condition on it (no untyped NULL parameter)
            _, rows = self.store.execute(DISPATCH.text[d.vendor], params)
        else:
            params.append(d.param(fresh_until))
            _, rows = self.store.execute(DISPATCH_FRESH.text[d.vendor], params)
        return int(rows[0][0]) if rows else None

    def why_refused(
        self, lease: Lease, key: str, owner: str, fresh_until: datetime | None = None
    ) -> str:
        """Why the guard refused ``key`` (recorded as a rejected event): the reason code."""
        d = self.store.dialect
        if fresh_until is None:
            sql, evidence_params = WHY_REFUSED, []
        else:
            sql, evidence_params = WHY_REFUSED_FRESH, [d.param(fresh_until)]
        _, rows = self.store.execute(
            sql.text[d.vendor],
            [lease.token, owner, lease.token, lease.owner, *evidence_params, lease.run_id, key],
        )
        return str(rows[0][0]).partition(":")[0] if rows else "changed"

    def _outcome(self, lease: Lease, key: str, sql: Sql, state: str, value: Any) -> bool:
        count, _ = self.store.execute(
            sql.text[self.store.dialect.vendor], [state, value, key, lease.run_id, lease.token]
        )
        return count == 1

    def succeed(self, lease: Lease, key: str, result: Any) -> bool:
        """Record the outcome the provider returned (the dispatching attempt knows it)."""
        return self._outcome(lease, key, OUTCOME_RESULT, "SUCCEEDED", json.dumps(result))

    def fail(self, lease: Lease, key: str, error: str) -> bool:
        """The provider refused for good (a definitive answer, nothing to retry)."""
        return self._outcome(lease, key, OUTCOME_ERROR, "FAILED", error)

    def not_sent(self, lease: Lease, key: str, error: str) -> bool:
        """Certainly never reached the provider: safe to dispatch again."""
        return self._outcome(lease, key, OUTCOME_ERROR, "NOT_DISPATCHED", error)

    def unknown(self, lease: Lease, key: str, error: str) -> bool:
        """The call may or may not have taken effect: reconcile before anything else."""
        return self._outcome(lease, key, OUTCOME_ERROR, "UNKNOWN", error)

    # -- the run's side --------------------------------------------------------------------

    def state_of(self, key: str) -> tuple[str, int, int] | None:
        """The effect ``key``'s state, lease token and dispatch number, or ``None``: what
        a write whose answer the connection lost left (did it commit?)."""
        _, rows = self.store.execute(STATE_OF.text[self.store.dialect.vendor], [key])
        if not rows:
            return None
        state, token, dispatches = rows[0]
        return str(state), int(token), int(dispatches)

    def unresolved(self, run_id: int) -> bool:
        """Does the run have an effect dispatched without a recorded outcome?"""
        _, rows = self.store.execute(UNRESOLVED.text[self.store.dialect.vendor], [run_id])
        return bool(rows)

    def unresolved_keys(self, run_id: int) -> list[str]:
        """The keys of the run's effects dispatched without a recorded outcome."""
        _, rows = self.store.execute(UNRESOLVED_KEYS.text[self.store.dialect.vendor], [run_id])
        return [str(row[0]) for row in rows]

    def unresolved_names(self, run_id: int) -> dict[str, str]:
        """The run's effects dispatched without a recorded outcome: key -> effect name."""
        _, rows = self.store.execute(UNRESOLVED_NAMES.text[self.store.dialect.vendor], [run_id])
        return {str(key): str(name) for key, name in rows}

    def mark_unknown(self, run_id: int, token: int) -> int:
        """The effects the lapsed attempt ``token`` dispatched without an outcome: UNKNOWN.

        Conditioned on the attempt's token: a newer attempt's live dispatch is never
        touched, whoever read the run as lapsed and whenever it acts.
        """
        count, _ = self.store.execute(MARK_UNKNOWN.text[self.store.dialect.vendor], [run_id, token])
        return count

    def pending(self, limit: int = 100) -> list[Pending]:
        """Unresolved effects of runs waiting (status UNKNOWN) for reconciliation."""
        _, rows = self.store.execute(PENDING.text[self.store.dialect.vendor], [limit])
        return [Pending(*row) for row in rows]

    def settle(
        self, seen: Pending, found: bool, result: Any, evidence: Any, *, by: str
    ) -> Settlement:
        """Settle the dispatch ``seen`` with evidence: found (SUCCEEDED) or not (safe to
        dispatch again). A compare-and-swap on what was asked about: if the effect has
        changed since it was read (settled by someone else, or dispatched again), nothing
        is written but a rejected event on the run, and the settlement says why. ``by``
        is recorded with it (the history credits the settlement to ``by``).
        """
        count, _ = self.store.execute(
            SETTLE.text[self.store.dialect.vendor],
            [
                "SUCCEEDED" if found else "NOT_DISPATCHED",
                json.dumps(result if found else None),
                json.dumps(evidence),
                by,
                seen.key,
                seen.state,
                seen.dispatches,
                seen.lease_token,
                seen.run_id,
            ],
        )
        if count == 1:
            return Settlement(True)
        detail = (
            f"effect {seen.key} changed since {seen.describe()} was read: it is now "
            f"{self.describe(seen.key)}; left as it is"
        )
        self.store.runs.record_rejected(seen.run_id, "effect_settle", seen.lease_token, by, detail)
        return Settlement(False, detail)

    def describe(self, key: str) -> str:
        """The effect as it stands: ``dispatch 2 (DISPATCHED, run 7, token 5)``."""
        _, rows = self.store.execute(DESCRIBE.text[self.store.dialect.vendor], [key])
        if not rows:
            return "gone"
        state, dispatches, run_id, token = rows[0]
        return f"dispatch {dispatches} ({state}, run {run_id}, token {token})"

    def settled_unknown(self, limit: int = 100) -> list[tuple[int, str, str]]:
        """UNKNOWN runs none of whose effects is unresolved any more (``run_id, task_id,
        task_name``): their effects were settled, e.g. by a late outcome of the attempt
        that dispatched them, and the run waits only for its release."""
        _, rows = self.store.execute(SETTLED_UNKNOWN.text[self.store.dialect.vendor], [limit])
        return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]

    def performed(self, run_id: int) -> dict[str, str]:
        """The run's effects with a recorded success (performed): key -> effect name."""
        _, rows = self.store.execute(PERFORMED.text[self.store.dialect.vendor], [run_id])
        return {str(key): str(name) for key, name in rows}

    def release_resolved(self, run_id: int, by: str = "the reconciler") -> Released | None:
        """An UNKNOWN run all of whose effects are resolved: queued again (token + 1) to
        replay or dispatch anew, or, past its deadline, EXPIRED (never resurrected):
        ``performed_past_deadline`` when an effect of it was performed (the detail names
        them), else ``deadline_passed``. Nothing is published for an expired run, so its
        ``published_at`` stays. ``by``: who settled its effects (the history says it).
        Returns what was written, or ``None`` (released by someone else, or an effect
        is unresolved)."""
        d = self.store.dialect
        performed = outcomes.performed_past_deadline_detail(self.performed(run_id))
        _, rows = self.store.execute(
            RELEASE_RESOLVED.text[d.vendor],
            [
                performed,
                outcomes.UNPERFORMED_PAST_DEADLINE,
                f"effects resolved by {by}",
                run_id,
                run_id,
            ],
        )
        if not rows:
            return None
        status, reason, deadline, detail = rows[0]
        return Released(str(status), str(reason), d.instant(deadline), str(detail))


_SQL: Final = queries("effects")
RECORD_INTENT: Final = _SQL["record_intent"]
DISPATCH: Final = _SQL["dispatch"]
DISPATCH_FRESH: Final = _SQL["dispatch_fresh"]
WHY_REFUSED: Final = _SQL["why_refused"]
WHY_REFUSED_FRESH: Final = _SQL["why_refused_fresh"]
OUTCOME_RESULT: Final = _SQL["outcome_result"]
OUTCOME_ERROR: Final = _SQL["outcome_error"]
STATE_OF: Final = _SQL["state_of"]
UNRESOLVED: Final = _SQL["unresolved"]
UNRESOLVED_KEYS: Final = _SQL["unresolved_keys"]
UNRESOLVED_NAMES: Final = _SQL["unresolved_names"]
MARK_UNKNOWN: Final = _SQL["mark_unknown"]
PENDING: Final = _SQL["pending"]
SETTLE: Final = _SQL["settle"]
DESCRIBE: Final = _SQL["describe"]
SETTLED_UNKNOWN: Final = _SQL["settled_unknown"]
PERFORMED: Final = _SQL["performed"]
RELEASE_RESOLVED: Final = _SQL["release_resolved"]
