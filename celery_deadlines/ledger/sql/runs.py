"""The run row's statements for the producer and the attempt, each one conditional
statement on the database clock (the rules are in docs/explanation/run-ledger.md, "make ownership a
compare-and-swap"):

* **enqueue**: the outbox row, before the message is published;
* **claim**: one ``UPDATE ... WHERE <claimable> RETURNING``; exactly one affected row is a
  claim, zero is not (another worker won, the run changed, it is terminal, its deadline
  leaves too little, or the message is older than the run). Every claim increments the
  run's fencing token (``lease_token``) and sets the lease expiry to the database clock
  plus the TTL, never later than the deadline. The claim's condition is its ``WHERE``, a
  check a line; a lost claim's reason is the first of them that does not hold;
* **fenced writes** (renew, checkpoint, retry, finish): conditional on the token the
  attempt claimed with *and* on its lease being alive by the database clock. Zero rows
  means the writer is stale; a rejected :class:`RunEvent` is recorded and the caller
  gets ``False`` (the attempt turns it into :class:`StaleLease`);
* **refusals** of the gates, and the worker's main process ending or letting lapse the
  attempt of a pool process it supervises.

Every applied write appends its :class:`RunEvent` through the audit trigger, in the same
statement: one round trip per state transition. Nothing here reads the worker's clock.
Each statement's text is in ``runs.sql``, under its name.
"""

from __future__ import annotations

import json
from dataclasses import astuple
from datetime import datetime, timedelta
from typing import Any, Final, NamedTuple

from ...rules.states import TERMINAL, Status
from .rows import (
    ENDED_IT,
    ClaimRefused,
    EndedRun,
    KeptResult,
    Lease,
    NewRun,
    Refusal,
    from_json,
    required,
)
from .statements import Sql, Statements, queries

#: The statuses a run ends in, as the ledger stores them.
TERMINAL_STATES: Final = frozenset(state.value for state in TERMINAL)

_SQL: Final = queries("runs")
#: The claim: on SQLite the compare-and-swap alone (its refusal is
#: :data:`CLAIM_REFUSAL_SQLITE`).
CLAIM: Final = _SQL["claim"]
CLAIM_REFUSAL_SQLITE: Final = _SQL["claim_refusal"]
RENEW: Final = _SQL["renew"]
CANCELLED_DEADLINE: Final = _SQL["cancelled_deadline"]
CHECKPOINT: Final = _SQL["checkpoint"]
FINISH: Final = _SQL["finish"]
RETRY: Final = _SQL["retry"]
RELEASE: Final = _SQL["release"]
HOLD: Final = _SQL["hold"]
LAST_WRITE: Final = _SQL["last_write"]
ENDED: Final = _SQL["ended"]
REJECTED_STALE: Final = _SQL["record_rejected"]
REJECTED_BECAUSE: Final = _SQL["record_rejected_because"]
REFUSE: Final = _SQL["refuse"]
REFUSE_CONFIRMED: Final = _SQL["refuse_for_the_deadline"]
REFUSE_MISMATCH: Final = _SQL["refuse_mismatch"]
REFUSED_RUN: Final = _SQL["refused_run"]


class _ClaimSql(NamedTuple):
    claim: str
    #: SQLite's refusal, a statement of its own (PostgreSQL's is part of ``claim``)
    refuse: str | None


#: The claim's texts per dialect (what a row of it says: ``runs.sql``, "claim").
_CLAIMS: Final = {
    "postgresql": _ClaimSql(CLAIM.text["postgresql"], None),
    "sqlite": _ClaimSql(CLAIM.text["sqlite"], CLAIM_REFUSAL_SQLITE.text["sqlite"]),
}


class Runs(Statements):
    """The run row's statements for the producer, the attempt and its supervisor."""

    # -- claim ---------------------------------------------------------------------------

    def claim(
        self,
        task_id: str,
        retries: int,
        *,
        task_name: str,
        owner: str,
        ttl: timedelta,
        reserve: timedelta,
        max_lost_leases: int,
        exclusive: bool = False,
        detail: str | None = None,
    ) -> Lease | ClaimRefused:
        """The compare-and-swap that lets exactly one worker run an attempt, of the run
        of ``task_id`` when it is a run of ``task_name`` (the message's task): a message
        naming another task is refused (``task_mismatch``) and changes nothing of it.

        On PostgreSQL a lost claim is recorded (its rejected event, with the first check
        that failed) by the same statement: one round trip whether it is won or lost.
        Run as a transaction of its own, a lost claim commits without waiting for the
        disk: it changed nothing else, and its event is worth less than the wait (a
        database crash just after may lose it). So does a won one when ``exclusive``:
        ``owner`` runs no other attempt until this one ends, and the owner fences every
        later write (``runs.sql``, "claim"). SQLite, in-process, runs the refusal as
        a second statement.

        ``detail``: the won claim's event's (the message's retries, and the time limits
        its attempt was given: :func:`~celery_deadlines.rules.limits.claim_detail`);
        by default the retries alone."""
        d = self.dialect
        sql = _CLAIMS[d.vendor]
        params = {
            "task_id": task_id,
            "task_name": task_name,
            "retries": retries,
            "reserve": d.seconds(reserve),
            "max_lost": max_lost_leases,
            "owner": owner,
            "ttl": d.seconds(ttl),
            "detail": f"retries={retries}" if detail is None else detail,
        }
        store = self.store
        if sql.refuse is None:  # PostgreSQL: whether a refusal may commit without waiting
            params["alone"] = store.commits_alone()
            params["exclusive"] = exclusive
        # a won claim is a clock reading
        _, rows = store.execute(sql.claim, params, timed=True)
        instant = d.instant
        if rows and rows[0][0]:
            row = rows[0]
            return Lease.claimed(
                row[1],  # run_id
                task_id,
                row[2],  # token
                row[3],  # version
                row[4],  # attempt
                instant(row[5]),  # expires_at
                instant(row[6]),  # deadline
                row[7],  # checkpoint_name
                from_json(row[8]),  # checkpoint_data
                required(instant(row[9])),  # database_now
                instant(row[10]),  # waiting_since
                owner,
            )
        if sql.refuse is not None:  # SQLite: the refusal is a statement of its own
            _, rows = store.execute(sql.refuse, params)
        if not rows:
            return ClaimRefused(ClaimRefused.MISSING, "", 0, "", None)
        row = rows[0]
        # the event's owner column is the loser; the detail names the current owner (the
        # task the message named, for a task_mismatch)
        why_code, _, current_owner = str(row[7]).partition(":")
        if why_code == ClaimRefused.TASK_MISMATCH:
            current_owner = ""
        return ClaimRefused.lost(
            why_code,
            row[11],  # the run's status
            row[2],  # its token
            current_owner,
            instant(row[5]),  # its lease's expiry
            instant(row[9]),  # the database clock
        )

    # -- fenced writes ---------------------------------------------------------------------

    def _fenced(self, sql: Sql, params: list[Any], lease: Lease, kind: str, owner: str) -> bool:
        """Run a fenced write (``runs.sql``, "checkpoint"): its own parameters, then the
        fence's."""
        count, _ = self.execute(
            sql.text[self.dialect.vendor], [*params, lease.run_id, lease.token, lease.owner]
        )
        if count == 1:
            return True
        self.record_rejected(lease.run_id, kind, lease.token, owner)
        return False

    def renew(self, lease: Lease, owner: str, ttl: timedelta) -> datetime | None:
        """Extend the lease to the database clock + ``ttl`` (never past the deadline).

        Returns the new expiry, or ``None`` if the lease is gone (stale, expired, or the
        deadline has passed): the caller must stop acting on the run.
        """
        d = self.dialect
        _, rows = self.execute(
            RENEW.text[d.vendor], [d.seconds(ttl), lease.run_id, lease.token, lease.owner]
        )
        if rows:
            return d.instant(rows[0][0])
        self.record_rejected(lease.run_id, "renew", lease.token, owner)
        return None

    def cancelled_deadline(self, run_id: int) -> datetime | None:
        """The deadline of run ``run_id`` if a cancel pulled it in, else ``None``."""
        d = self.dialect
        _, rows = self.execute(CANCELLED_DEADLINE.text[d.vendor], [run_id])
        return d.instant(rows[0][0]) if rows else None

    def checkpoint(self, lease: Lease, owner: str, name: str, data: Any) -> bool:
        """Persist progress under the attempt's token (fenced)."""
        return self._fenced(
            CHECKPOINT,
            [name, json.dumps(data), name],
            lease,
            "checkpoint",
            owner,
        )

    def finish(
        self,
        lease: Lease,
        owner: str,
        status: Status,
        reason: str = "",
        detail: str = "",
        result: KeptResult | None = None,
        traceback: str | None = None,
        op_detail: str | None = None,
    ) -> bool:
        """End the run (SUCCEEDED, FAILED, EXPIRED, UNKNOWN) under the attempt's token,
        keeping ``result`` (a success's return value; ``None``: none kept) and
        ``traceback`` (a failed body's, bounded by the caller) in the same statement.
        ``op_detail``: what the last write says of itself (``detail`` by default;
        :data:`~.predicates.EAGER_RUN` for an eager run's end).

        If one of the run's effects is dispatched without an outcome, the run ends UNKNOWN
        whatever ``status`` says: the attempt may not know of it (another attempt's
        dispatch), and the reconciler must settle it before the run may end.
        """
        kept = (None, None, None) if result is None else astuple(result)
        return self._fenced(
            FINISH,
            [
                status.value,
                reason,
                detail,
                status.value.lower(),
                detail if op_detail is None else op_detail,
                *kept,
                traceback,
            ],
            lease,
            status.value.lower(),
            owner,
        )

    def last_write(self, lease: Lease) -> tuple[str, int, str, str] | None:
        """The run's status, token, owner and last write (``op``), to settle a write
        whose answer the database connection lost: did it commit?"""
        _, rows = self.execute(LAST_WRITE.text[self.dialect.vendor], [lease.run_id])
        if not rows:
            return None
        status, token, owner, op = rows[0]
        return str(status), int(token), str(owner), str(op)

    def ended(self, task_id: str) -> EndedRun | None:
        """How the run of ``task_id`` ended (status, reason, detail, deadline, and when,
        by the database clock), or ``None`` if it has not ended or is not recorded: what
        a later delivery of its message tells a caller the ended attempt never told."""
        _, rows = self.execute(ENDED.text[self.dialect.vendor], [task_id])
        if not rows:
            return None
        name, status, reason, detail, deadline, ended_at, body, content_type, encoding = rows[0]
        kept = None
        if body is not None and content_type is not None:
            kept = KeptResult(bytes(body), str(content_type), str(encoding or ""))
        return EndedRun(
            task_id=task_id,
            task_name=str(name),
            status=str(status),
            reason=str(reason),
            deadline=self.dialect.instant(deadline),
            detail=str(detail),
            ended_at=self.dialect.instant(ended_at),
            result=kept,
        )

    def retry(
        self,
        lease: Lease,
        owner: str,
        *,
        retries: int,
        available_at: datetime | None,
        message_body: bytes | None,
        detail: str,
    ) -> bool:
        """Hand the run to its retry message (fenced): RETRYING, lease released."""
        d = self.dialect
        return self._fenced(
            RETRY,
            [retries, d.param(available_at), message_body, detail],
            lease,
            "retry",
            owner,
        )

    def release(self, lease: Lease, owner: str, detail: str) -> bool:
        """Give the run back to the queue (the task rejected its message with requeue)."""
        return self._fenced(
            RELEASE,
            [detail],
            lease,
            "release",
            owner,
        )

    def hold(self, lease: Lease, owner: str, detail: str) -> bool:
        """Give a just-claimed run back unstarted, as CLOCK_UNCERTAIN (fenced): the
        claiming worker's clock is beyond the skew budget. It stays claimable; a worker
        whose clock agrees publishes it again (:meth:`unclaimed`)."""
        return self._fenced(
            HOLD,
            [detail, detail],
            lease,
            "clock_hold",
            owner,
        )

    def record_rejected(
        self, run_id: int, kind: str, token: int, owner: str, why: str | None = None
    ) -> None:
        """Append a rejected write: by default a stale holder's (its token, and the
        current owner's); ``why`` says otherwise (e.g. ``stale_evidence: ...``)."""
        sql = REJECTED_STALE if why is None else REJECTED_BECAUSE
        self.execute(
            sql.text[self.dialect.vendor],
            [kind, token, owner, why if why is not None else str(token), run_id],
        )

    # -- refusals recorded by the gates ------------------------------------------------------

    def refuse(
        self,
        task_id: str,
        task_name: str,
        retries: int,
        *,
        status: Status,
        reason: str,
        detail: str,
        deadline: datetime | None,
        confirm_within: timedelta | None = None,
    ) -> Refusal:
        """A gate refused a message: end its run, unless another worker owns it now, or
        it is not a run of ``task_name`` (the message's task: then it is left as it is,
        and the refusal recorded in its history as a rejected ``refuse``,
        ``task_mismatch``).

        ``confirm_within``: a refusal for the deadline; a recorded run ends only if its
        deadline is within this much of the database clock's now (the reserve), so a
        worker whose clock runs ahead cannot expire a run that is still in time. A run
        with no row (published by name, or before the app was installed) gets one,
        already ended. Returns what the call did: ended the run, or why not, read in a
        statement more (only then) from the run as it is now.
        """
        d = self.dialect
        params = [status.value, reason, detail, detail, task_id, task_name, retries]
        if confirm_within is None:
            count, _ = self.execute(REFUSE.text[d.vendor], params)
        else:
            params.append(d.seconds(confirm_within))
            count, _ = self.execute(REFUSE_CONFIRMED.text[d.vendor], params)
        if count:
            return ENDED_IT  # (a recorded run still in time by the database clock is left)
        unrecorded = NewRun(
            task_id=task_id,
            task_name=task_name,
            deadline=deadline,
            delivery_deadline=None,
            root_id="",
            parent_id="",
            retries=retries,
            available_at=None,
            message_body=None,
            content_type="",
            content_encoding="",
        )
        if self.store.outbox.record_ended(
            unrecorded, status, reason, detail, "refuse", published=True
        ):
            return ENDED_IT
        _, rows = self.execute(REFUSED_RUN.text[d.vendor], [task_id])
        if not rows:  # purged meanwhile: nothing is left to end
            return Refusal(Refusal.NOT_ENDED)
        name, seen, why, owner, lease_expires_at, run_deadline, run_retries, now = rows[0]
        if name != task_name:
            # the id is another task's run: it stays as it is, the refusal in its history
            self.execute(REFUSE_MISMATCH.text[d.vendor], [task_name, task_id, task_name])
            return Refusal(Refusal.TASK_MISMATCH)
        return _not_ended(
            str(seen),
            str(why),
            str(owner),
            d.instant(lease_expires_at),
            d.instant(run_deadline),
            run_retries != retries,
            required(d.instant(now)),
            confirm_within,
        )


def _not_ended(
    status: str,
    reason: str,
    owner: str,
    lease_expires_at: datetime | None,
    deadline: datetime | None,
    other_attempt: bool,
    now: datetime,
    confirm_within: timedelta | None,
) -> Refusal:
    """Why a refusal did not end the run, as the run is by the database clock ``now``:
    what the ``refuse`` statement's condition found false, the same checks in its order."""
    if status in TERMINAL_STATES:
        return Refusal(Refusal.ALREADY_ENDED, status, reason)
    if other_attempt:  # a message of an earlier attempt: the run moved on
        return Refusal(Refusal.NOT_ENDED, status, reason)
    if status == Status.RUNNING and lease_expires_at is not None and lease_expires_at > now:
        return Refusal(Refusal.OWNED, status, reason, owner=owner)
    if confirm_within is not None and (deadline is None or deadline > now + confirm_within):
        return Refusal(Refusal.NOT_CONFIRMED, status, reason, deadline=deadline, database_now=now)
    return Refusal(Refusal.NOT_ENDED, status, reason)  # an effect's outcome not recorded
