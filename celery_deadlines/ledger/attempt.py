"""One claimed attempt of a run, in the pool process that executes its body.

Everything the attempt writes is fenced by the token it claimed with; a refused write
raises :class:`StaleLease` and is recorded as a rejected event. The heartbeat renews the
lease while the body runs; a refused renewal sets :attr:`Attempt.lost`, which a long
body may poll to stop early (its next write would be refused anyway).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import DatabaseError

from ..errors import StaleLease
from ..rules.skew import ClockReading
from ..rules.states import Status
from ..signals import write_refused
from .heartbeat import heartbeat
from .patience import CONNECTION_ERRORS, Patience
from .sql.connection import Store
from .sql.effects import Effects
from .sql.plans import StoredPlan
from .sql.predicates import EAGER_RUN
from .sql.rows import KeptResult, Lease

#: How many lease TTLs an attempt keeps writing its end while the database is away.
FINISH_PATIENCE = 4

_T = TypeVar("_T")


def owner_name(hostname: str | None) -> str:
    """Who holds a lease: the worker's node name and this process's pid."""
    return owner_name_of(hostname, os.getpid())


def owner_name_of(hostname: str | None, pid: object) -> str:
    return f"{hostname or 'unknown'}:{pid}"


@dataclass(eq=False)
class Attempt:
    """A won claim and the fenced writes it may make (identity-hashed, for the heartbeat)."""

    store: Store
    lease: Lease
    owner: str
    ttl: timedelta
    lost: bool = field(default=False)
    #: the claim's round trip as a clock reading (the ledger's clock against this one)
    reading: ClockReading | None = None
    #: an eager run's (``apply()``): its caller was told in its own process, and Celery
    #: stores no result of it unless ``task_store_eager_result``
    eager: bool = False
    #: keys this attempt dispatched whose outcome is not recorded (or is UNKNOWN)
    unresolved: set[str] = field(default_factory=set)
    #: the effect name of each key this attempt dispatched (who can reconcile it)
    effect_names: dict[str, str] = field(default_factory=dict)
    #: the effects this run has performed (key -> name): this attempt's, and those an
    #: earlier attempt performed and this one replayed
    performed: dict[str, str] = field(default_factory=dict)
    #: the monotonic reading at which the run's deadline passes (set when the attempt's
    #: budget is anchored): a write is never tried past it, its lease ends there too
    deadline_at: float | None = None
    #: told the run's pulled-in deadline and the monotonic reading it was learnt at,
    #: when a renewal finds the run cancelled (the Celery tier's attempt follows it)
    pulled_in: Callable[[datetime, float], None] | None = None
    #: a renewal found the run cancelled: its body's end is the cancel's, whatever it is
    cancelled: bool = False
    #: the body's termination when a cancel is learnt (a task's ``cancel_terminates``:
    #: the Celery tier's ``Termination``), told of each effect's dispatch and outcome
    termination: Any = None

    @property
    def effects(self) -> Effects:
        return self.store.effects

    def __str__(self) -> str:
        return f"run {self.lease.task_id} token {self.lease.token}"

    @property
    def last_checkpoint(self) -> tuple[str, Any] | None:
        """The last durable checkpoint when the attempt was claimed: (name, data)."""
        if not self.lease.checkpoint_name:
            return None
        return self.lease.checkpoint_name, self.lease.checkpoint_data

    def start(self) -> None:
        """Renew the lease while the body runs: the heartbeat does, on a connection of
        its own, which cannot reach a row written in a transaction not yet committed
        (an eager run's, on SQLite inside the caller's transaction: no other connection
        can write to it, nor see the run, until it commits, after the run has ended).
        That lease is the one the claim gave, not renewed."""
        if self.store.dedicated:
            heartbeat().watch(self)

    def stop(self) -> None:
        heartbeat().forget(self)

    def renew(self) -> datetime | None:
        """Extend the lease (the heartbeat calls this); ``None`` marks the attempt lost."""
        expires = self.store.runs.renew(self.lease, self.owner, self.ttl)
        if expires is None:
            self.lost = True
        return expires

    def cancelled_deadline(self) -> datetime | None:
        """The run's deadline if it was cancelled (pulled in by a cancel), else ``None``:
        asked once, after a refused renewal."""
        return self.store.runs.cancelled_deadline(self.lease.run_id)

    def checkpoint(self, name: str, data: Any) -> None:
        # the same values under the same fence: written again, it changes nothing more
        runs = self.store.runs
        written = self.patiently(
            "checkpoint", lambda: runs.checkpoint(self.lease, self.owner, name, data)
        )
        self.check(written, "checkpoint")

    def patiently(
        self, what: str, write: Callable[[], _T], done: Callable[[], _T | None] | None = None
    ) -> _T:
        """``write()``, a statement the body makes through the library (an effect's
        intent, guard or outcome, a checkpoint, a plan, the ledger's clock for an
        observation), through a database that may be away: tried again every
        :data:`~.patience.RETRY_INTERVAL` for at most one lease, the claim's rule, and
        never past the run's deadline (:attr:`deadline_at`).

        A write whose answer the connection lost may have committed: ``done()`` reads
        what it would have left and returns its answer, or ``None`` to write again (a
        write that is the same under its fence whatever ran before needs none). After a
        whole lease without the database (or once the deadline has passed) this
        attempt's lease has lapsed (no renewal reached it; a lease ends at the deadline):
        :class:`StaleLease` is raised, so the body stops, Celery stores nothing, and the
        reconciler requeues or expires the run, or, if an effect was dispatched, marks it
        UNKNOWN. Never the body's failure: a lost connection is not its outcome.
        """
        patience = Patience(self.ttl, until=self.deadline_at)
        answer_lost = False
        while True:
            try:
                if answer_lost and done is not None:
                    found = done()
                    if found is not None:
                        return found
                return write()
            except CONNECTION_ERRORS as exc:
                answer_lost = True
                if patience.spent():
                    self.lost = True
                    span = (
                        "until the run's deadline passed"
                        if patience.cut_short
                        else f"(a lease is {self.ttl.total_seconds()} s)"
                    )
                    why = (
                        f"the ledger's database was unreachable for {patience.waited():.1f} s "
                        f"{span}: {exc}"
                    )
                    raise StaleLease(self.lease.task_id, self.lease.token, what, why) from exc
            patience.pause()

    def database_now(self) -> datetime:
        """The ledger's clock (the database's), read :meth:`patiently`."""
        return self.patiently("a reading of the ledger's clock", self.store.database_now)

    def active_plan(self) -> StoredPlan | None:
        """The run's active plan, read :meth:`patiently`."""
        plans, run_id = self.store.plans, self.lease.run_id
        return self.patiently("a read of the active plan", lambda: plans.active(run_id))

    def save_plan(self, plan_id: str, document: dict[str, Any]) -> None:
        """Make ``document`` the run's active plan, under this attempt's fence, written
        :meth:`patiently`: a save whose answer was lost is found as the active plan."""
        plans = self.store.plans

        def saved() -> bool | None:
            active = plans.active(self.lease.run_id)
            mine = active is not None and active.lease_token == self.lease.token
            return True if mine and active is not None and active.document == document else None

        written = self.patiently(
            f"plan {plan_id}",
            lambda: plans.save(self.lease, self.owner, plan_id, document),
            done=saved,
        )
        self.check(written, "save_plan")

    def invalidate_plan(self, row_id: int, reason: str, detail: str) -> None:
        """Retire the active plan ``row_id`` (it failed its resume gate), written
        :meth:`patiently`: an invalidation whose answer was lost is found."""
        plans = self.store.plans

        def retired() -> bool | None:
            return True if plans.state_of(row_id) == "INVALIDATED" else None

        written = self.patiently(
            f"invalidation of plan {row_id}",
            lambda: plans.invalidate(self.lease, self.owner, row_id, reason, detail),
            done=retired,
        )
        self.check(written, "invalidate_plan")

    def succeed(self, result: KeptResult | None = None) -> None:
        """End the run SUCCEEDED, keeping ``result`` (:mod:`.results`) in the same write."""
        self.check(self._finish(Status.SUCCEEDED, "", "", result), "succeed")

    def end(self, status: Status, reason: str, detail: str, traceback: str | None = None) -> None:
        """End the run ``status`` (``traceback``: a failed body's, bounded)."""
        self.check(self._finish(status, reason, detail, traceback=traceback), "finish")

    def _finish(
        self,
        status: Status,
        reason: str,
        detail: str,
        result: KeptResult | None = None,
        traceback: str | None = None,
    ) -> bool:
        """Write the run's end (:meth:`_last_write`); an eager run's says so in its last
        write's detail (:data:`~.sql.predicates.EAGER_RUN`)."""
        runs = self.store.runs
        said = EAGER_RUN if self.eager else None
        return self._last_write(
            lambda: runs.finish(
                self.lease, self.owner, status, reason, detail, result, traceback, said
            ),
            status.value.lower(),
        )

    def _last_write(self, write: Callable[[], bool], op: str) -> bool:
        """``write()``, the fenced write that ends this attempt (its ``op`` as the run
        records it), through a database connection that may be lost meanwhile.

        A lost connection is not the body's outcome: it must neither end the run FAILED
        with the connection's error nor tell the caller FAILURE of a run the ledger
        ended otherwise (a success whose commit's answer was lost; a retry Celery could
        not publish, which it would end ``rejected``). The write may have committed:
        the run is read again. Moved on by this token with this write: it did. Still
        RUNNING under this token: it is written again. Anything else: the lease is gone
        (refused; the reconciler or the next holder ends the run). The database away for longer than
        :data:`FINISH_PATIENCE` leases: refused too (the lease has lapsed by then; the
        reconciler requeues the run and its effects are replayed).
        """
        runs = self.store.runs
        patience = Patience(FINISH_PATIENCE * self.ttl)
        while True:
            try:
                return write()
            except DatabaseError:
                if patience.spent():
                    return False
            patience.pause()
            try:
                found = patience.reach(lambda: runs.last_write(self.lease), (DatabaseError,))
            except DatabaseError:
                return False
            if found is None:
                return False
            now_status, token, owner, last_op = found
            if (token, owner) != (self.lease.token, self.lease.owner):
                return False
            if now_status != Status.RUNNING:
                return last_op == op

    def end_overrun(self, status: Status, reason: str, detail: str) -> str | None:
        """End the run of a body that ran past its deadline, whose own end was refused
        (its lease ended at the deadline), in the process that ran it: an eager run's
        caller, which no worker supervises and no reconciler may visit. As a worker's main
        process ends its pool process's attempt
        (:meth:`~.sql.supervision.Supervision.end_owned`): fenced by this attempt's owner,
        UNKNOWN when an effect lacks an outcome. The status written, or ``None`` when the
        run is not this owner's any more."""
        return self.store.supervision.end_owned(
            self.lease.task_id, self.owner, status, reason, detail
        )

    def retry(
        self, retries: int, available_at: datetime | None, body: bytes | None, detail: str
    ) -> None:
        """Hand the run to its retry message (:meth:`_last_write`: the database may be
        away for a moment; the retry message is published only once this is written)."""
        runs = self.store.runs
        written = self._last_write(
            lambda: runs.retry(
                self.lease,
                self.owner,
                retries=retries,
                available_at=available_at,
                message_body=body,
                detail=detail,
            ),
            "retry",
        )
        self.check(written, "retry")

    def release(self, detail: str) -> None:
        self.check(self.store.runs.release(self.lease, self.owner, detail), "release")

    def check(self, written: bool, write: str) -> None:
        """A fenced write's outcome: refused marks the attempt lost, is announced
        (``write_refused``) and raises :class:`StaleLease`."""
        if not written:
            self.lost = True
            write_refused.send(sender=self, task_id=self.lease.task_id, write=write)
            raise StaleLease(self.lease.task_id, self.lease.token, write)
