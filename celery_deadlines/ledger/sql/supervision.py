"""The worker's main process, about the attempts of its own pool processes.

It supervises the pool process that holds a lease, so it may end that attempt when the
process's hard time limit fires, or let the lease lapse at once when the process is lost
(the reconciler then settles the run without waiting for the TTL).
"""

from __future__ import annotations

from ...rules.states import Status
from .predicates import EFFECT, HAS_UNRESOLVED, RUN, SUPERVISOR_GRACE, TERMINAL_SQL
from .statements import Statements


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
        reconcile, not to guess: docs/failure-semantics.md), and those effects are
        marked UNKNOWN in the same transaction. Returns the status written, or ``None``
        if the attempt was not this owner's any more.
        """
        d = self.dialect
        # one transaction: a reconciler must never see the run UNKNOWN with its effect
        # still DISPATCHED, or it settles the effect first and the trail lacks the
        # effect's UNKNOWN (an integration test on a loaded machine saw it)
        with self.store.transaction():
            _, rows = self.execute(
                f"""
                UPDATE {RUN} SET
                    status = CASE WHEN {HAS_UNRESOLVED} THEN 'UNKNOWN' ELSE %s END,
                    reason = CASE WHEN {HAS_UNRESOLVED} THEN 'effect_unresolved' ELSE %s END,
                    detail = %s, lease_token = lease_token + 1, lease_expires_at = NULL,
                    version = version + 1, op = 'end_owned', op_detail = %s,
                    updated_at = {d.now}
                WHERE task_id = %s AND status = 'RUNNING' AND owner = %s
                RETURNING id, status
                """,
                [status.value, reason, detail, detail, task_id, owner],
            )
            if not rows:
                return None
            run_id, written = rows[0]
            if written == Status.UNKNOWN:
                self.execute(
                    f"""
                    UPDATE {EFFECT} SET state = 'UNKNOWN', updated_at = {d.now},
                        error = %s
                    WHERE run_id = %s AND state = 'DISPATCHED'
                    """,
                    [detail, run_id],
                )
        return str(written)

    def lapse_owned(self, task_id: str, owner: str, detail: str) -> bool:
        """Let the lease of a lost pool process lapse now, for the reconciler to settle.
        ``True`` when the reconciler settles the run: its lease lapsed now, or the run is
        recorded and unfinished (the lease had lapsed already, and the run was requeued,
        marked UNKNOWN or claimed again); ``False`` for a run that ended or that the
        ledger does not know."""
        d = self.dialect
        count, _ = self.execute(
            f"""
            UPDATE {RUN} SET lease_expires_at = {d.now_plus}, version = version + 1,
                op = 'worker_lost', op_detail = %s, updated_at = {d.now}
            WHERE task_id = %s AND status = 'RUNNING' AND owner = %s
            """,
            [d.seconds(-SUPERVISOR_GRACE), detail, task_id, owner],
        )
        if count == 1:
            return True
        _, rows = self.execute(
            f"SELECT 1 FROM {RUN} WHERE task_id = %s AND status NOT IN {TERMINAL_SQL}",
            [task_id],
        )
        return bool(rows)
