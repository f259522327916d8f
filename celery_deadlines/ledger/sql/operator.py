"""The operator's actions on a run (the admin): each one compare-and-swap.

Each statement's text is in ``operator.sql``, under its name.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from .rows import EndedRun
from .statements import Statements, queries


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
            EXPIRE_NOW.text[d.vendor],
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
            REQUEUE_NOW.text[d.vendor],
            [detail, detail, run_id],
        )
        return count == 1


_SQL: Final = queries("operator")
CANCEL: Final = _SQL["cancel"]
EXPIRE_NOW: Final = _SQL["expire_now"]
REQUEUE_NOW: Final = _SQL["requeue_now"]
