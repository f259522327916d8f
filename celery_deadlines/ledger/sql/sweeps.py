"""The reconciler's and the scheduler's statements: expiry, lapsed leases, republish,
occurrences. Each is a compare-and-swap on the state it was decided from (the version
read, the status), so any number of workers may sweep at once: one wins each run, the
others change nothing.

Each statement's text is in ``sweeps.sql``, under its name.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Final

from ...rules.states import Status
from .predicates import SUPERVISOR_GRACE
from .rows import (
    EndedRun,
    LapsedLease,
    NewRun,
    Recorded,
    Unclaimed,
    as_bytes,
    required,
)
from .statements import Statements, queries


class Sweeps(Statements):
    """Statements of the worker's reconciler and of the scheduler."""

    def known(self, task_ids: list[str]) -> set[str]:
        """Which of ``task_ids`` have a run (in any state): a scheduler's durable memory."""
        if not task_ids:
            return set()
        d = self.dialect
        _, rows = self.execute(KNOWN.text[d.vendor], [d.values(task_ids)])
        return {row[0] for row in rows}

    def last_occurrence(self, schedule: str) -> datetime | None:
        """The latest occurrence of ``schedule`` the ledger holds a run for (any state)."""
        _, rows = self.execute(LAST_OCCURRENCE.text[self.dialect.vendor], [schedule])
        return self.dialect.instant(rows[0][0]) if rows else None

    def record_missed(self, run: NewRun, detail: str) -> bool:
        """Record a scheduled occurrence whose window closed before it was published:
        EXPIRED, reason ``missed_occurrence``, never run late. ``False`` if the id exists."""
        return self.store.outbox.record_ended(
            run, Status.EXPIRED, "missed_occurrence", detail, "missed"
        )

    # -- reconciliation ----------------------------------------------------------------------

    def expire_unclaimed(self, limit: int = 500) -> list[EndedRun]:
        """End runs whose deadline passed while they waited: before any worker claimed
        them, or while they were paused. The reason is the one a worker's gate gives for
        the same deadline (``deadline_passed``; ``delivery_expired`` for a delivery
        task's run): one word for one situation, whoever finds it."""
        _, rows = self.execute(EXPIRE_UNCLAIMED.text[self.dialect.vendor], [limit])
        return self._ended(rows)

    def ended_maybe_untold(
        self, after: tuple[datetime, int], until: datetime, limit: int = 200
    ) -> list[tuple[tuple[datetime, int], EndedRun]]:
        """The runs ended after the position ``after`` (``updated_at``, id) and no later
        than ``until`` (by the database clock) whose caller whoever ended them may have
        left waiting, in that order, each with its position: the ones the sweeper or the
        reconciler ended FAILED or EXPIRED, and the successes whose completion kept a
        return value, not read here (:func:`~..reconcile.reconcile_once`)."""
        d = self.dialect
        at, run_id = d.param(after[0]), after[1]
        params = [at, d.param(until), at, run_id, limit]
        _, rows = self.execute(ENDED_MAYBE_UNTOLD.text[d.vendor], params)
        # each row ends with its position: updated_at (the run's end), then the id
        return [
            ((required(run.ended_at), int(row[7])), run)
            for run, row in zip(self._ended(rows), rows, strict=True)
        ]

    def _ended(self, rows: list[tuple[Any, ...]]) -> list[EndedRun]:
        """:class:`EndedRun` from rows of ``task_id, task_name, status, reason, deadline,
        detail``, and ``updated_at`` (its end) where a row goes on."""
        instant = self.dialect.instant
        return [
            EndedRun(
                task_id=r[0],
                task_name=r[1],
                status=r[2],
                reason=r[3],
                deadline=instant(r[4]),
                detail=r[5],
                ended_at=instant(r[6]) if len(r) > 6 else None,
            )
            for r in rows
        ]

    def lapsed_leases(self, limit: int = 100) -> list[LapsedLease]:
        """Runs whose lease expired by the database clock (the first two steps of restart
        reconciliation, docs/explanation/run-ledger.md).

        Only leases lapsed for :data:`SUPERVISOR_GRACE` already: a pool process killed by
        its hard time limit at the deadline (where its lease also ends) is settled by its
        own worker first, so the outcome does not depend on who is quicker.
        """
        d = self.dialect
        _, rows = self.execute(LAPSED_LEASES.text[d.vendor], [d.seconds(-SUPERVISOR_GRACE), limit])
        return [
            LapsedLease(
                run_id=r[0],
                task_id=r[1],
                task_name=r[2],
                version=r[3],
                token=r[4],
                owner=r[5],
                lost_leases=r[6],
                deadline=d.instant(r[7]),
                past_deadline=bool(r[8]),
                delivery_task=bool(r[9]),
                cancelled=bool(r[10]),
            )
            for r in rows
        ]

    def settle_lapsed(
        self,
        lapsed: LapsedLease,
        status: Status,
        reason: str,
        detail: str,
        *,
        unresolved: bool = False,
    ) -> bool:
        """End (or mark UNKNOWN) a run whose lease lapsed, if it has not changed since read
        and still has (``unresolved``) or has not an effect without a recorded outcome,
        as when the decision was taken."""
        sql = SETTLE_LAPSED_UNRESOLVED if unresolved else SETTLE_LAPSED
        count, _ = self.execute(
            sql.text[self.dialect.vendor],
            [status.value, reason, detail, detail, lapsed.run_id, lapsed.version],
        )
        return count == 1

    def requeue_lapsed(self, lapsed: LapsedLease) -> bool:
        """Give a lapsed run back to the queue with a fresh token (fences the old holder)."""
        count, _ = self.execute(
            REQUEUE_LAPSED.text[self.dialect.vendor],
            [
                f"lease of {lapsed.owner} (token {lapsed.token}) lapsed",
                lapsed.run_id,
                lapsed.version,
            ],
        )
        return count == 1

    def unclaimed(
        self, republish_after: timedelta, limit: int = 100, *, held: bool = False
    ) -> list[Unclaimed]:
        """Runs unclaimed ``republish_after`` after their last publish *and* after they
        became due (a retry's countdown): the broker may have lost their message.

        ``held``: also every CLOCK_UNCERTAIN run at once (the caller's clock agrees with
        the ledger's, so the hold is over); otherwise they wait like any other.
        """
        d = self.dialect
        _, rows = self.execute(
            UNCLAIMED.text[d.vendor],
            [d.seconds(-republish_after), d.seconds(-republish_after), int(held), limit],
        )
        return [self._message(row) for row in rows]

    def mark_republished(self, run_id: int, version: int) -> bool:
        """Claim the right to republish a run (one reconciler wins per version); a held
        (CLOCK_UNCERTAIN) run is QUEUED again."""
        count, _ = self.execute(MARK_REPUBLISHED.text[self.dialect.vendor], [run_id, version])
        return count == 1

    def fail_unreadable(self, run_id: int, detail: str) -> bool:
        """End a run whose recorded message no worker would decode (``FAILED``,
        ``message_unreadable``): publishing it again can never run it. ``False`` if it
        is no longer waiting for a worker."""
        count, _ = self.execute(FAIL_UNREADABLE.text[self.dialect.vendor], [detail, detail, run_id])
        return count == 1

    def message_of(self, run_id: int) -> Unclaimed | None:
        """A run's outbox message (for a requeue)."""
        _, rows = self.execute(MESSAGE_OF.text[self.dialect.vendor], [run_id])
        return self._message(rows[0]) if rows else None

    def recorded(self, task_id: str) -> Recorded | None:
        """The run ``task_id`` as it was published: its outbox message, its queue and
        root (what a run the ledger ends is told to the result backend with)."""
        _, rows = self.execute(RECORDED.text[self.dialect.vendor], [task_id])
        if not rows:
            return None
        *message, queue, root_id = rows[0]
        return Recorded(self._message(tuple(message)), queue or None, root_id or None)

    def end_by_celery(self, task_id: str, status: str, reason: str, detail: str) -> bool:
        """End an unfinished run Celery itself ended (revoked, terminated, or its own
        ``expires`` passed, in a worker): ``status`` and ``reason`` say which; a holder
        of its lease is fenced. ``False`` if it had ended already, or if one of its
        effects has no recorded outcome (the reconciler asks what happened first)."""
        count, _ = self.execute(
            END_BY_CELERY.text[self.dialect.vendor], [status, reason, detail, detail, task_id]
        )
        return count == 1

    def _message(self, row: tuple[Any, ...]) -> Unclaimed:
        """An :class:`Unclaimed` from a row of ``unclaimed`` (``sweeps.sql``)."""
        run_id, task_id, name, version, retries, available_at, body, ctype, encoding = row
        return Unclaimed(
            run_id=run_id,
            task_id=task_id,
            task_name=name,
            version=version,
            retries=retries,
            available_at=self.dialect.instant(available_at),
            message_body=as_bytes(body),
            content_type=ctype,
            content_encoding=encoding,
        )


_SQL: Final = queries("sweeps")
KNOWN: Final = _SQL["known"]
LAST_OCCURRENCE: Final = _SQL["last_occurrence"]
EXPIRE_UNCLAIMED: Final = _SQL["expire_unclaimed"]
ENDED_MAYBE_UNTOLD: Final = _SQL["ended_maybe_untold"]
LAPSED_LEASES: Final = _SQL["lapsed_leases"]
SETTLE_LAPSED: Final = _SQL["settle_lapsed"]
SETTLE_LAPSED_UNRESOLVED: Final = _SQL["settle_lapsed_unresolved"]
REQUEUE_LAPSED: Final = _SQL["requeue_lapsed"]
UNCLAIMED: Final = _SQL["unclaimed"]
MARK_REPUBLISHED: Final = _SQL["mark_republished"]
FAIL_UNREADABLE: Final = _SQL["fail_unreadable"]
MESSAGE_OF: Final = _SQL["message_of"]
RECORDED: Final = _SQL["recorded"]
END_BY_CELERY: Final = _SQL["end_by_celery"]
