"""The worker's main process, about the attempts of its own pool processes.

It supervises the pool process that holds a lease, so it may end that attempt when the
process's hard time limit fires, or let the lease lapse at once when the process is lost
(the reconciler then settles the run without waiting for the TTL).

Each statement's text is in ``supervision.sql``, under its name.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from ...rules.states import Status
from .predicates import SUPERVISOR_GRACE
from .statements import Statements, queries


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

    def cancelled_running(self, task_ids: Collection[str]) -> set[str]:
        """Of ``task_ids`` (the runs this worker is running), those a cancel pulled in."""
        d = self.dialect
        _, rows = self.execute(CANCELLED_RUNNING.text[d.vendor], [d.values(task_ids)])
        return {str(task_id) for (task_id,) in rows}


_SQL: Final = queries("supervision")
END_OWNED: Final = _SQL["end_owned"]
END_OWNED_EFFECTS: Final = _SQL["end_owned_effects"]
LAPSE_OWNED: Final = _SQL["lapse_owned"]
UNFINISHED: Final = _SQL["unfinished"]
CANCELLED_RUNNING: Final = _SQL["cancelled_running"]
