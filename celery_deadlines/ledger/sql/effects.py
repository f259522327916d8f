"""The effect ledger's statements: intent, the dispatch guard, outcomes, reconciliation.

At most one side effect per key. The guard is one conditional write, evaluated against
the database clock, immediately before the external call: the effect moves
INTENT_RECORDED (or NOT_DISPATCHED) -> DISPATCHED only if the caller's run is RUNNING
under the caller's token, its lease is alive and its deadline has not passed. Zero rows:
the call must not be made. Every change of an effect appends a RunEvent through the
audit trigger (kind ``effect_<state>``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from ...rules import outcomes
from ...rules.outcomes import PERFORMED_PAST_DEADLINE
from .rows import Lease, from_json
from .statements import Sql, Statements


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


RECORD_INTENT: Final = Sql(
    "effects.record_intent",
    """
    INSERT INTO {effect} (key, run_id, name, kind, state, lease_token, fingerprint,
        dispatches, error, created_at, updated_at)
    VALUES (%s, %s, %s, %s, 'INTENT_RECORDED', %s, %s, 0, '', {now}, {now})
    ON CONFLICT (key) DO UPDATE SET asked_at = {now}
    RETURNING state, fingerprint, result, lease_token
    """,
)

_DISPATCH = """
    UPDATE {effect} SET state = 'DISPATCHED', lease_token = %s, run_id = %s,
        dispatches = dispatches + 1, dispatched_at = {now}, updated_at = {now},
        settled_by = NULL
    WHERE key = %s AND state IN ('INTENT_RECORDED', 'NOT_DISPATCHED')
      AND EXISTS (
        SELECT 1 FROM {run} r
        WHERE r.id = %s AND r.lease_token = %s AND r.owner = %s AND r.status = 'RUNNING'
          AND r.lease_expires_at > {now}
          AND (r.deadline IS NULL OR r.deadline > {now})
      )
      {fresh}
    RETURNING dispatches
"""
#: The dispatch guard.
DISPATCH: Final = Sql("effects.dispatch", _DISPATCH, fresh="")
#: The dispatch guard of an effect relying on evidence: the database clock has not
#: reached the evidence's earliest expiry (the last parameter) either.
DISPATCH_FRESH: Final = Sql("effects.dispatch_fresh", _DISPATCH, fresh="AND %s > {now}")

_WHY_REFUSED = """
    INSERT INTO {event} (run_id, at, kind, outcome, status, reason, version,
        lease_token, owner, lease_expires_at, detail)
    SELECT r.id, {now}, 'dispatch', 'rejected', r.status, r.reason, r.version, %s, %s,
        r.lease_expires_at,
        CASE
            WHEN e.state IN {unresolved} THEN 'unresolved'
            WHEN e.state IN ('SUCCEEDED', 'FAILED') THEN 'completed'
            WHEN r.deadline IS NOT NULL AND r.deadline <= {now} THEN 'deadline_passed'
            WHEN r.lease_token <> %s OR r.owner <> %s OR r.status <> 'RUNNING'
                 OR r.lease_expires_at IS NULL OR r.lease_expires_at <= {now}
                THEN 'stale_lease'
            {stale}
            ELSE 'changed'
        END || ':' || e.key
    FROM {run} r, {effect} e
    WHERE r.id = %s AND e.key = %s
      {run_kept:r}
    RETURNING detail
"""
#: Why the guard refused (the first reason that holds), recorded as a rejected event.
WHY_REFUSED: Final = Sql("effects.why_refused", _WHY_REFUSED, stale="")
WHY_REFUSED_FRESH: Final = Sql(
    "effects.why_refused_fresh", _WHY_REFUSED, stale="WHEN %s <= {now} THEN 'stale_evidence'"
)

# an outcome is fenced by the run *and* its token: tokens count per run, and a key may
# pass from one run to another (reconciled as not sent, then dispatched by a duplicate run)
_OUTCOME = """
    UPDATE {effect} SET state = %s, {value}, updated_at = {now}
    WHERE key = %s AND run_id = %s AND lease_token = %s AND state IN {unresolved}
"""
OUTCOME_RESULT: Final = Sql("effects.outcome_result", _OUTCOME, value="result = {json}")
OUTCOME_ERROR: Final = Sql("effects.outcome_error", _OUTCOME, value="error = %s")

STATE_OF: Final = Sql(
    "effects.state_of", "SELECT state, lease_token, dispatches FROM {effect} WHERE key = %s"
)
UNRESOLVED: Final = Sql(
    "effects.unresolved",
    "SELECT 1 FROM {effect} WHERE run_id = %s AND state IN {unresolved} LIMIT 1",
)
UNRESOLVED_KEYS: Final = Sql(
    "effects.unresolved_keys",
    "SELECT key FROM {effect} WHERE run_id = %s AND state IN {unresolved} ORDER BY id",
)
UNRESOLVED_NAMES: Final = Sql(
    "effects.unresolved_names",
    "SELECT key, name FROM {effect} WHERE run_id = %s AND state IN {unresolved} ORDER BY id",
)
MARK_UNKNOWN: Final = Sql(
    "effects.mark_unknown",
    """
    UPDATE {effect} SET state = 'UNKNOWN', updated_at = {now},
        error = 'the attempt ended without recording an outcome'
    WHERE run_id = %s AND lease_token = %s AND state = 'DISPATCHED'
    """,
)
PENDING: Final = Sql(
    "effects.pending",
    """
    SELECT e.key, e.name, e.fingerprint, e.lease_token, r.id, r.task_id, r.task_name,
        e.state, e.dispatches
    FROM {effect} e JOIN {run} r ON r.id = e.run_id
    WHERE e.state IN {unresolved} AND r.status = 'UNKNOWN'
    ORDER BY e.id
    LIMIT %s
    """,
)
#: A settlement: a compare-and-swap on the dispatch that was asked about; who settled it
#: is recorded (the audit trigger makes it the event's owner; the next dispatch clears it).
SETTLE: Final = Sql(
    "effects.settle",
    """
    UPDATE {effect} SET state = %s, result = {json},
        evidence = {json}, settled_by = %s, updated_at = {now}
    WHERE key = %s AND state = %s AND dispatches = %s AND lease_token = %s
      AND run_id = %s
    """,
)
DESCRIBE: Final = Sql(
    "effects.describe", "SELECT state, dispatches, run_id, lease_token FROM {effect} WHERE key = %s"
)
SETTLED_UNKNOWN: Final = Sql(
    "effects.settled_unknown",
    """
    SELECT r.id, r.task_id, r.task_name FROM {run} r
    WHERE r.status = 'UNKNOWN' AND NOT EXISTS (
        SELECT 1 FROM {effect} e WHERE e.run_id = r.id AND e.state IN {unresolved}
    )
    ORDER BY r.id
    LIMIT %s
    """,
)
PERFORMED: Final = Sql(
    "effects.performed",
    "SELECT key, name FROM {effect} WHERE run_id = %s AND state = 'SUCCEEDED' ORDER BY id",
)
#: An UNKNOWN run whose effects are all resolved: queued again (token + 1; its message is
#: published, its UNKNOWN detail no longer holds), or, past its deadline, EXPIRED (never
#: resurrected, nothing published): ``performed_past_deadline`` with the first detail
#: parameter when an effect of it was performed, else the expiry's reason with the
#: second. The clock is read once for the four columns it decides (PostgreSQL's clock
#: moves within a statement: read twice, a deadline passing between the readings would
#: queue the run with an expiry's reason).
RELEASE_RESOLVED: Final = Sql(
    "effects.release_resolved",
    """
    UPDATE {run} SET
        (status, reason, detail, published_at) = (
            SELECT
                CASE WHEN c.past THEN 'EXPIRED' ELSE 'QUEUED' END,
                CASE WHEN NOT c.past THEN ''
                     WHEN c.performed THEN '{performed_reason}'
                     ELSE {expiry_reason} END,
                CASE WHEN NOT c.past THEN '' WHEN c.performed THEN %s ELSE %s END,
                CASE WHEN c.past THEN {run}.published_at ELSE {now} END
            FROM (SELECT {past} AS past, {performed} AS performed) c
        ),
        lease_token = lease_token + 1, owner = '', lease_expires_at = NULL,
        version = version + 1, op = 'reconciled', op_detail = %s, updated_at = {now}
    WHERE id = %s AND status = 'UNKNOWN'
      AND NOT EXISTS (
        SELECT 1 FROM {effect} WHERE run_id = %s AND state IN {unresolved}
      )
    RETURNING status, reason, deadline, detail
    """,
    past="(deadline IS NOT NULL AND deadline <= {now})",
    performed=(
        "EXISTS (SELECT 1 FROM {effect} p WHERE p.run_id = {run}.id AND p.state = 'SUCCEEDED')"
    ),
    performed_reason=PERFORMED_PAST_DEADLINE,
)
