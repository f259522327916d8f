"""The operator's actions on a run (the admin): each one compare-and-swap."""

from __future__ import annotations

from datetime import datetime
from typing import Final

from ...rules.gates import Reason
from .dialect import Dialect
from .predicates import HAS_UNRESOLVED, REQUEUEABLE_SQL, RUN, TERMINAL_SQL
from .rows import EndedRun
from .statements import Sql, Statements


class OperatorActions(Statements):
    """Expire now, requeue, cancel with everything it started."""

    def cancel(self, task_id: str, detail: str, at: datetime | None = None) -> int:
        """Pull in the deadline of the run of ``task_id`` and of every run it started,
        down its tree (``parent_id``), to the database clock's now (or ``at``, if
        earlier), never later than each one's own; marked ``cancelled`` with ``detail``
        (who and why, in each run's history). One statement, whatever the tree's size.
        Returns how many unended runs it changed (0: ended, or not recorded)."""
        d = self.dialect
        count, _ = self.execute(
            CANCEL.text[d.vendor],
            {"task_id": task_id, "detail": detail, "at": d.param(at)},
        )
        return count

    def expire_now(self, run_id: int, operator: str) -> EndedRun | None:
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
        return EndedRun(
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


#: The cancel's instant: the database clock, or the earlier ``at`` given (never later).
def _cancel_instant(d: Dialect) -> str:
    return d.least(d.now, "%(at)s")


#: A run and its descendants (``parent_id`` is the parent's task id; ``UNION`` visits
#: each once; the recursion inside the ``WHERE``, so that SQLite counts the rows an
#: ``UPDATE`` changed), every unended one's deadline pulled in, never lengthened: the claim
#: refuses it ``cancelled`` (``CLAIM_CHECKS``), a renewal past it fails, and whoever
#: finds it past ends it ``cancelled`` (``EXPIRY_REASON_SQL``).
CANCEL: Final = Sql(
    "operator.cancel",
    f"""
    UPDATE {{run}} SET deadline = {{pulled_in}},
        reason = '{Reason.CANCELLED.value}', detail = %(detail)s,
        version = version + 1, op = 'cancel', op_detail = %(detail)s, updated_at = {{now}}
    WHERE task_id IN (
        WITH RECURSIVE tree (task_id) AS (
            SELECT task_id FROM {{run}} WHERE task_id = %(task_id)s
            UNION
            SELECT child.task_id FROM {{run}} child JOIN tree ON child.parent_id = tree.task_id
        )
        SELECT task_id FROM tree
    ) AND status NOT IN {{terminal}}
    """,
    pulled_in=lambda d: d.least(_cancel_instant(d), "deadline"),
)
