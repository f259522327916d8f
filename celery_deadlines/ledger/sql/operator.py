"""The operator's actions on a run (the admin): each one compare-and-swap."""

from __future__ import annotations

from .predicates import HAS_UNRESOLVED, REQUEUEABLE_SQL, RUN, TERMINAL_SQL
from .rows import Expired
from .statements import Statements


class OperatorActions(Statements):
    """Expire now, requeue."""

    def expire_now(self, run_id: int, operator: str) -> Expired | None:
        """End an unfinished run at once; its holder, if any, is fenced (token + 1).
        Returns the run as it ended, or ``None`` if it had ended already, or if one of
        its effects has no recorded outcome: it is resolved first (an EXPIRED run's
        effects are never asked about again)."""
        d = self.dialect
        detail = f"expired by {operator}"
        _, rows = self.execute(
            f"""
            UPDATE {RUN} SET status = 'EXPIRED', reason = 'expired_by_operator', detail = %s,
                lease_token = lease_token + 1, lease_expires_at = NULL,
                version = version + 1, op = 'expire_now', op_detail = %s, updated_at = {d.now}
            WHERE id = %s AND status NOT IN {TERMINAL_SQL} AND NOT {HAS_UNRESOLVED}
            RETURNING task_id, task_name, deadline
            """,
            [detail, detail, run_id],
        )
        if not rows:
            return None
        task_id, task_name, deadline = rows[0]
        return Expired(
            task_id=task_id,
            task_name=task_name,
            status="EXPIRED",
            reason="expired_by_operator",
            deadline=d.instant(deadline),
            detail=detail,
        )

    def requeue_now(self, run_id: int, operator: str) -> bool:
        """Queue a failed, unknown or stuck run again, if its deadline allows.

        A run another worker holds a live lease on is left alone; a lapsed lease is
        fenced (token + 1). Succeeded and expired runs are final.
        """
        d = self.dialect
        detail = f"requeued by {operator}"
        count, _ = self.execute(
            f"""
            UPDATE {RUN} SET status = 'QUEUED', reason = '', detail = %s,
                lease_token = lease_token + 1, owner = '', lease_expires_at = NULL,
                available_at = NULL, published_at = {d.now}, version = version + 1,
                op = 'requeue_now', op_detail = %s, updated_at = {d.now}
            WHERE id = %s
              AND (status IN {REQUEUEABLE_SQL}
                   OR (status = 'RUNNING' AND lease_expires_at <= {d.now}))
              AND (deadline IS NULL OR deadline > {d.now})
              AND message_body IS NOT NULL
              AND NOT {HAS_UNRESOLVED}
            """,
            [detail, detail, run_id],
        )
        return count == 1
