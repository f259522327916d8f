"""The worker's main process, about the attempts of its own pool processes.

It supervises the pool process that holds a lease, so it may end that attempt when the
process's hard time limit fires, or let the lease lapse at once when the process is lost
(the reconciler then settles the run without waiting for the TTL).
"""

from __future__ import annotations

from typing import Final

from ...rules.states import Status
from .predicates import SUPERVISOR_GRACE
from .statements import Sql, Statements


class Supervision(Statements):
    """End or lapse the attempt of a pool process this worker supervises."""

    def end_owned(
        self, task_id: str, owner: str, status: Status, reason: str, detail: str
    ) -> str | None:
        """End the attempt a pool process of this worker holds (its hard time limit hit).

        The main process supervises the pool process that owns the lease, so it may end
        that attempt; the token is bumped, which fences the killed process for good. If
        the attempt had dispatched an effect without recording its outcome, the run
        ends UNKNOWN instead (a deadline during a provider call is an outcome to
        reconcile, not to guess: docs/explanation/ledger-failures.md), and those effects are
        marked UNKNOWN in the same transaction. Returns the status written, or ``None``
        if the attempt was not this owner's any more.
        """
        vendor = self.dialect.vendor
        # one transaction: a reconciler must never see the run UNKNOWN with its effect
        # still DISPATCHED, or it settles the effect first and the trail lacks the
        # effect's UNKNOWN
        with self.store.transaction():
            _, rows = self.execute(
                END_OWNED.text[vendor],
                [status.value, reason, detail, detail, task_id, owner],
            )
            if not rows:
                return None
            run_id, written = rows[0]
            if written == Status.UNKNOWN:
                self.execute(END_OWNED_EFFECTS.text[vendor], [detail, run_id])
        return str(written)

    def lapse_owned(self, task_id: str, owner: str, detail: str) -> bool:
        """Let the lease of a lost pool process lapse now, for the reconciler to settle.
        ``True`` when the reconciler settles the run: its lease lapsed now, or the run is
        recorded and unfinished (the lease had lapsed already, and the run was requeued,
        marked UNKNOWN or claimed again); ``False`` for a run that ended or that the
        ledger does not know."""
        d = self.dialect
        count, _ = self.execute(
            LAPSE_OWNED.text[d.vendor], [d.seconds(-SUPERVISOR_GRACE), detail, task_id, owner]
        )
        if count == 1:
            return True
        _, rows = self.execute(UNFINISHED.text[d.vendor], [task_id])
        return bool(rows)


#: The attempt of a pool process this worker supervises, ended (token + 1); UNKNOWN if
#: one of its effects has no recorded outcome.
END_OWNED: Final = Sql(
    "supervision.end_owned",
    """
    UPDATE {run} SET
        status = CASE WHEN {has_unresolved} THEN 'UNKNOWN' ELSE %s END,
        reason = CASE WHEN {has_unresolved} THEN 'effect_unresolved' ELSE %s END,
        detail = %s, lease_token = lease_token + 1, lease_expires_at = NULL,
        version = version + 1, op = 'end_owned', op_detail = %s,
        updated_at = {now}
    WHERE task_id = %s AND status = 'RUNNING' AND owner = %s
    RETURNING id, status
    """,
)
#: Its effects dispatched without an outcome: UNKNOWN (in the same transaction).
END_OWNED_EFFECTS: Final = Sql(
    "supervision.end_owned_effects",
    """
    UPDATE {effect} SET state = 'UNKNOWN', updated_at = {now},
        error = %s
    WHERE run_id = %s AND state = 'DISPATCHED'
    """,
)
#: The lease of a lost pool process, lapsed now (less the supervisor's grace).
LAPSE_OWNED: Final = Sql(
    "supervision.lapse_owned",
    """
    UPDATE {run} SET lease_expires_at = {now_plus}, version = version + 1,
        op = 'worker_lost', op_detail = %s, updated_at = {now}
    WHERE task_id = %s AND status = 'RUNNING' AND owner = %s
    """,
)
UNFINISHED: Final = Sql(
    "supervision.unfinished", "SELECT 1 FROM {run} WHERE task_id = %s AND status NOT IN {terminal}"
)
