"""Every write to the run ledger, each one conditional statement on the database clock.

The rules (seed 000, "make ownership a compare-and-swap"):

* **claim**: one ``UPDATE ... WHERE <claimable> RETURNING``; exactly one affected row
  is a claim, zero is not (another worker won, the run changed, it is terminal, its
  deadline leaves too little, or the message is older than the run). Every claim
  increments the run's fencing token (``lease_token``) and sets the lease expiry to
  the database clock plus the TTL, never later than the deadline.
* **fenced writes** (renew, checkpoint, retry, finish): conditional on the token the
  attempt claimed with *and* on its lease being alive by the database clock. Zero rows
  means the writer is stale; the store records a rejected :class:`RunEvent` and the
  caller gets ``False`` (the attempt turns it into :class:`StaleLease`).
* every applied write appends its :class:`RunEvent` through the audit trigger, in the
  same statement: one round trip per state transition.

Nothing here reads the worker's clock: expiries and comparisons are evaluated in SQL.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import load_backend

from ..clock import get_clock
from ..models import Status
from .sql import Dialect, dialect_for

RUN: Final = "celery_deadlines_run"
EVENT: Final = "celery_deadlines_runevent"
EFFECT: Final = "celery_deadlines_effect"

#: A dedicated connection idle longer than this is pinged before its next statement.
IDLE_PING: Final = 1.0

#: How long a lapsed lease is left to the worker that supervised it before the
#: reconciler settles it (that worker ends attempts killed by their time limit).
SUPERVISOR_GRACE: Final = timedelta(seconds=1)

_TERMINAL_SQL: Final = "('SUCCEEDED', 'FAILED', 'EXPIRED')"
_CLAIMABLE_SQL: Final = "('QUEUED', 'RETRYING', 'CLOCK_UNCERTAIN')"
#: Unfinished runs no worker holds: the deadline ends them by the database clock.
_WAITING_SQL: Final = "('QUEUED', 'RETRYING', 'CLOCK_UNCERTAIN', 'PAUSED')"
#: Effects dispatched without a known outcome: their run waits for reconciliation.
UNRESOLVED_SQL: Final = "('DISPATCHED', 'UNKNOWN')"
#: True for the run row being updated when one of its effects is unresolved.
_HAS_UNRESOLVED: Final = (
    f"EXISTS (SELECT 1 FROM {EFFECT} WHERE {EFFECT}.run_id = {RUN}.id"
    f" AND {EFFECT}.state IN {UNRESOLVED_SQL})"
)


@dataclass(frozen=True)
class NewRun:
    """What the outbox records before a message is published."""

    task_id: str
    task_name: str
    deadline: datetime | None
    delivery_deadline: datetime | None
    root_id: str
    parent_id: str
    retries: int
    available_at: datetime | None
    message_body: bytes | None
    content_type: str
    content_encoding: str
    #: a scheduled run's occurrence (see :class:`celery_deadlines.schedules.Occurrence`)
    not_before: datetime | None = None
    schedule: str | None = None
    schedule_zone: str | None = None
    schedule_local: str | None = None


@dataclass(frozen=True)
class Lease:
    """A won claim: the fencing token and what the attempt resumes from."""

    run_id: int
    task_id: str
    token: int
    version: int
    attempt: int
    expires_at: datetime | None
    deadline: datetime | None
    checkpoint_name: str
    checkpoint_data: Any
    database_now: datetime
    #: when the run last became claimable (its publish, or a retry's countdown end)
    waiting_since: datetime | None = None


@dataclass(frozen=True)
class ClaimRefused:
    """A lost claim, and why (``why`` is one of the codes below)."""

    why: str
    status: str
    token: int
    owner: str
    lease_expires_at: datetime | None

    #: ``why`` codes
    TERMINAL: Final = "terminal"
    STALE_MESSAGE: Final = "stale_message"
    DEADLINE: Final = "deadline"
    HELD: Final = "held"
    LOST_LEASES: Final = "lost_leases"
    UNKNOWN: Final = "unknown"
    #: a lapsed attempt dispatched an effect with no recorded outcome: reconcile first
    UNRESOLVED: Final = "unresolved"
    CHANGED: Final = "changed"
    MISSING: Final = "missing"


@dataclass(frozen=True)
class Expired:
    """A run the ledger expired or failed on its own (the reconciler reports these)."""

    task_id: str
    task_name: str
    status: str
    reason: str
    deadline: datetime | None
    detail: str = ""


class Store:
    """The ledger's statements on one Django database alias.

    ``dedicated=False`` (the producer's store) runs them on Django's connection for the
    alias, so the outbox row joins the caller's transaction. ``dedicated=True`` (the
    worker's) runs them on a connection of its own per process and thread, kept open
    across tasks: Celery's Django fixup closes Django's connections before and after
    every task, and a new connection costs more than the ledger's statements. Its writes
    commit at once (autocommit), whatever transaction the task body has open.
    """

    def __init__(self, using: str = "default", *, dedicated: bool = False) -> None:
        self.using = using
        self.dedicated = dedicated
        self._dialect: Dialect | None = None
        self._local = threading.local()

    @property
    def dialect(self) -> Dialect:
        if self._dialect is None:
            self._dialect = dialect_for(connections[self.using].vendor)
        return self._dialect

    def _connection(self) -> BaseDatabaseWrapper:
        if not self.dedicated:
            return connections[self.using]
        local = self._local
        connection: BaseDatabaseWrapper | None = getattr(local, "connection", None)
        if connection is None or local.pid != os.getpid():  # first use, or a forked child
            settings = {**connections.settings[self.using], "CONN_MAX_AGE": None}
            wrapper = load_backend(settings["ENGINE"]).DatabaseWrapper
            connection = local.connection = wrapper(settings, self.using)
            local.pid = os.getpid()
            local.used_at = get_clock().monotonic()
        connection.close_if_unusable_or_obsolete()  # reconnects after a database error
        now = get_clock().monotonic()
        # a connection idle through a database restart or a network cut fails its next
        # statement; a claim must not fail for that: ping it first, reconnect if dead
        idle = now - local.used_at > IDLE_PING and connection.connection is not None
        if idle and not connection.is_usable():
            connection.close()
        local.used_at = now
        return connection

    def close(self) -> None:
        """Close this thread's dedicated connection (a thread that stops calls this)."""
        connection = getattr(self._local, "connection", None)
        if connection is not None and self._local.pid == os.getpid():
            connection.close()
            if connection.connection is not None:
                # Django keeps an in-memory SQLite database open on close(), lest the
                # data go with it; this connection is the store's own, never the last
                connection.connection.close()
                connection.connection = None
        self._local.connection = None

    def execute(
        self, sql: str, params: list[Any], *, timed: bool = False
    ) -> tuple[int, list[tuple[Any, ...]]]:
        """Run one statement; (rows affected, rows returned). ``timed``: the statement
        returns the database clock; the local clock is read just before and after the
        statement itself (:meth:`last_round_trip`), so it is a clock reading whatever
        reconnecting or pinging the connection took."""
        with self._connection().cursor() as cursor:
            if not timed:
                cursor.execute(sql, params)
                return cursor.rowcount, (cursor.fetchall() if cursor.description else [])
            clock = get_clock()
            sent = clock.now()
            cursor.execute(sql, params)
            rows = cursor.fetchall() if cursor.description else []
            self._local.round_trip = (sent, clock.now())
            return cursor.rowcount, rows

    def last_round_trip(self) -> tuple[datetime, datetime]:
        """This thread's last statement: the local clock when it was sent and answered."""
        trip: tuple[datetime, datetime] = self._local.round_trip
        return trip

    # -- the outbox ----------------------------------------------------------------------

    def enqueue(self, run: NewRun) -> bool:
        """Record a run before its message is published; ``False`` if the id exists."""
        d = self.dialect
        count, _ = self.execute(
            f"""
            INSERT INTO {RUN} (
                task_id, task_name, status, reason, detail, deadline, delivery_deadline,
                root_id, parent_id, retries, attempt, lost_leases, owner, lease_token,
                version, checkpoint_name, message_body, content_type, content_encoding,
                available_at, published_at, op, op_detail, created_at, updated_at,
                not_before, schedule, schedule_zone, schedule_local
            ) VALUES (
                %s, %s, 'QUEUED', '', '', %s, %s, %s, %s, %s, 0, 0, '', 0, 0, '', %s, %s, %s,
                %s, {d.now}, 'enqueue', '', {d.now}, {d.now}, %s, %s, %s, %s
            )
            ON CONFLICT (task_id) DO NOTHING
            """,
            [
                run.task_id,
                run.task_name,
                d.param(run.deadline),
                d.param(run.delivery_deadline),
                run.root_id,
                run.parent_id,
                run.retries,
                run.message_body,
                run.content_type,
                run.content_encoding,
                d.param(run.available_at),
                d.param(run.not_before),
                run.schedule,
                run.schedule_zone,
                run.schedule_local,
            ],
        )
        return count == 1

    def known(self, task_ids: list[str]) -> set[str]:
        """Which of ``task_ids`` have a run (in any state): a scheduler's durable memory."""
        if not task_ids:
            return set()
        marks = ", ".join(["%s"] * len(task_ids))
        _, rows = self.execute(f"SELECT task_id FROM {RUN} WHERE task_id IN ({marks})", task_ids)
        return {row[0] for row in rows}

    def last_occurrence(self, schedule: str) -> datetime | None:
        """The latest occurrence of ``schedule`` the ledger holds a run for (any state)."""
        _, rows = self.execute(f"SELECT MAX(not_before) FROM {RUN} WHERE schedule = %s", [schedule])
        return self.dialect.instant(rows[0][0]) if rows else None

    def record_missed(self, run: NewRun, detail: str) -> bool:
        """Record a scheduled occurrence whose window closed before it was published:
        EXPIRED, reason ``missed_occurrence``, never run late. ``False`` if the id exists."""
        return self._record_ended(run, Status.EXPIRED, "missed_occurrence", detail, "missed")

    def _record_ended(
        self, run: NewRun, status: Status, reason: str, detail: str, op: str, *,
        published: bool = False,
    ) -> bool:  # fmt: skip
        """Insert ``run`` already ended (never claimed); ``False`` if the id exists."""
        d = self.dialect
        published_at = d.now if published else "NULL"
        count, _ = self.execute(
            f"""
            INSERT INTO {RUN} (
                task_id, task_name, status, reason, detail, deadline, root_id, parent_id,
                retries, attempt, lost_leases, owner, lease_token, version, checkpoint_name,
                content_type, content_encoding, published_at, op, op_detail, created_at,
                updated_at, not_before, schedule, schedule_zone, schedule_local
            ) VALUES (
                %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, 0, '', 0, 0, '', '', '', {published_at},
                %s, %s, {d.now}, {d.now}, %s, %s, %s, %s
            )
            ON CONFLICT (task_id) DO NOTHING
            """,
            [
                run.task_id, run.task_name, status.value, reason, detail, d.param(run.deadline),
                run.root_id, run.parent_id, run.retries, op, detail, d.param(run.not_before),
                run.schedule, run.schedule_zone, run.schedule_local,
            ],
        )  # fmt: skip
        return count == 1

    def publish_failed(self, task_id: str, detail: str) -> bool:
        """End a run whose first publish raised: the caller was told, nothing will run."""
        d = self.dialect
        count, _ = self.execute(
            f"""
            UPDATE {RUN} SET status = 'FAILED', reason = 'publish_failed', detail = %s,
                version = version + 1, op = 'publish_failed', op_detail = %s,
                updated_at = {d.now}
            WHERE task_id = %s AND status = 'QUEUED' AND attempt = 0
            """,
            [detail, detail, task_id],
        )
        return count == 1

    # -- claim ---------------------------------------------------------------------------

    def claim(
        self,
        task_id: str,
        retries: int,
        owner: str,
        ttl: timedelta,
        reserve: timedelta,
        max_lost_leases: int,
    ) -> Lease | ClaimRefused:
        """The compare-and-swap that lets exactly one worker run an attempt."""
        d = self.dialect
        _, rows = self.execute(  # timed: a won claim is also a clock reading
            f"""
            UPDATE {RUN} SET
                status = 'RUNNING', owner = %s,
                lease_token = lease_token + 1, version = version + 1, attempt = attempt + 1,
                lost_leases = lost_leases + (CASE WHEN status = 'RUNNING' THEN 1 ELSE 0 END),
                lease_expires_at = {d.least(d.now_plus, "deadline")},
                op = 'claim', op_detail = %s, updated_at = {d.now}
            WHERE task_id = %s AND retries = %s
              AND (status IN {_CLAIMABLE_SQL}
                   OR (status = 'RUNNING' AND lease_expires_at <= {d.now_plus}
                       AND lost_leases < %s))
              AND (deadline IS NULL OR deadline > {d.now_plus})
              AND NOT {_HAS_UNRESOLVED}
            RETURNING id, lease_token, version, attempt, lease_expires_at, deadline,
                checkpoint_name, checkpoint_data, {d.now},
                CASE WHEN available_at IS NOT NULL AND available_at > published_at
                     THEN available_at ELSE published_at END
            """,
            [
                owner,
                d.seconds(ttl),
                f"retries={retries}",
                task_id,
                retries,
                # a lapsed lease is taken over only after the grace: its supervisor ends
                # it first (a time limit), and a dispatch guard that passed while it was
                # live has committed (the guard and the claim read each other's rows
                # without locks)
                d.seconds(-SUPERVISOR_GRACE),
                max_lost_leases,
                d.seconds(reserve),
            ],
            timed=True,
        )
        if rows:
            row = rows[0]
            return Lease(
                run_id=row[0],
                task_id=task_id,
                token=row[1],
                version=row[2],
                attempt=row[3],
                expires_at=d.instant(row[4]),
                deadline=d.instant(row[5]),
                checkpoint_name=row[6],
                checkpoint_data=_json(row[7]),
                database_now=_required(d.instant(row[8])),
                waiting_since=d.instant(row[9]),
            )
        return self._claim_refused(task_id, retries, owner, reserve, max_lost_leases)

    def _claim_refused(
        self, task_id: str, retries: int, owner: str, reserve: timedelta, max_lost_leases: int
    ) -> ClaimRefused:
        """Record the lost claim (one statement) and say why it was lost."""
        d = self.dialect
        _, rows = self.execute(
            f"""
            INSERT INTO {EVENT} ({_EVENT_COLUMNS})
            SELECT id, {d.now}, 'claim', 'rejected', status, reason, version, lease_token,
                %s, lease_expires_at,
                CASE
                    WHEN status IN {_TERMINAL_SQL} THEN 'terminal'
                    WHEN retries <> %s THEN 'stale_message'
                    WHEN {_HAS_UNRESOLVED}
                         AND NOT (status = 'RUNNING' AND lease_expires_at > {d.now})
                        THEN 'unresolved'
                    WHEN deadline IS NOT NULL AND deadline <= {d.now_plus} THEN 'deadline'
                    WHEN status = 'RUNNING' AND lease_expires_at > {d.now_plus} THEN 'held'
                    WHEN status = 'RUNNING' AND lost_leases >= %s THEN 'lost_leases'
                    WHEN status = 'UNKNOWN' THEN 'unknown'
                    ELSE 'changed'
                END || ':' || owner
            FROM {RUN} WHERE task_id = %s
            RETURNING detail, status, lease_token, lease_expires_at
            """,
            [
                owner,
                retries,
                d.seconds(reserve),
                d.seconds(-SUPERVISOR_GRACE),
                max_lost_leases,
                task_id,
            ],
        )
        if not rows:
            return ClaimRefused(ClaimRefused.MISSING, "", 0, "", None)
        detail, status, token, expires = rows[0]
        # the event's owner column is the loser; the detail names the current owner
        why, _, current_owner = str(detail).partition(":")
        return ClaimRefused(why, status, token, current_owner, d.instant(expires))

    # -- fenced writes ---------------------------------------------------------------------

    def _fenced(self, sets: str, params: list[Any], lease: Lease, kind: str, owner: str) -> bool:
        d = self.dialect
        count, _ = self.execute(
            f"""
            UPDATE {RUN} SET {sets}, version = version + 1, updated_at = {d.now}
            WHERE id = %s AND lease_token = %s AND status = 'RUNNING'
              AND lease_expires_at > {d.now}
            """,
            [*params, lease.run_id, lease.token],
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
            f"""
            UPDATE {RUN} SET lease_expires_at = {d.least(d.now_plus, "deadline")},
                version = version + 1, op = 'renew', op_detail = '', updated_at = {d.now}
            WHERE id = %s AND lease_token = %s AND status = 'RUNNING'
              AND lease_expires_at > {d.now}
              AND (deadline IS NULL OR deadline > {d.now})
            RETURNING lease_expires_at
            """,
            [d.seconds(ttl), lease.run_id, lease.token],
        )
        if rows:
            return d.instant(rows[0][0])
        self.record_rejected(lease.run_id, "renew", lease.token, owner)
        return None

    def checkpoint(self, lease: Lease, owner: str, name: str, data: Any) -> bool:
        """Persist progress under the attempt's token (fenced)."""
        d = self.dialect
        return self._fenced(
            f"checkpoint_name = %s, checkpoint_data = {d.json_param}, checkpoint_at = {d.now}, "
            "checkpoint_token = lease_token, op = 'checkpoint', op_detail = %s",
            [name, json.dumps(data), name],
            lease,
            "checkpoint",
            owner,
        )

    def finish(
        self, lease: Lease, owner: str, status: Status, reason: str = "", detail: str = ""
    ) -> bool:
        """End the run (SUCCEEDED, FAILED, EXPIRED, UNKNOWN) under the attempt's token.

        If one of the run's effects is dispatched without an outcome, the run ends UNKNOWN
        whatever ``status`` says: the attempt may not know of it (another attempt's
        dispatch), and the reconciler must settle it before the run may end.
        """
        return self._fenced(
            f"status = CASE WHEN {_HAS_UNRESOLVED} THEN 'UNKNOWN' ELSE %s END, "
            f"reason = CASE WHEN {_HAS_UNRESOLVED} THEN 'effect_unresolved' ELSE %s END, "
            "detail = %s, lease_expires_at = NULL, op = %s, op_detail = %s",
            [status.value, reason, detail, status.value.lower(), detail],
            lease,
            status.value.lower(),
            owner,
        )

    def retry(
        self,
        lease: Lease,
        owner: str,
        retries: int,
        available_at: datetime | None,
        message_body: bytes | None,
        detail: str,
    ) -> bool:
        """Hand the run to its retry message (fenced): RETRYING, lease released."""
        d = self.dialect
        return self._fenced(
            f"status = 'RETRYING', retries = %s, available_at = %s, message_body = %s, "
            f"lease_expires_at = NULL, published_at = {d.now}, op = 'retry', op_detail = %s",
            [retries, d.param(available_at), message_body, detail],
            lease,
            "retry",
            owner,
        )

    def release(self, lease: Lease, owner: str, detail: str) -> bool:
        """Give the run back to the queue (the task rejected its message with requeue)."""
        d = self.dialect
        return self._fenced(
            f"status = 'QUEUED', lease_expires_at = NULL, published_at = {d.now}, "
            "op = 'release', op_detail = %s",
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
            "status = 'CLOCK_UNCERTAIN', reason = 'clock_uncertain', detail = %s, "
            "owner = '', lease_expires_at = NULL, op = 'clock_hold', op_detail = %s",
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
        d = self.dialect
        detail = (
            "%s"
            if why is not None
            else "'stale token ' || %s || '; current token ' || lease_token || ' owned by ' "
            "|| owner"
        )
        self.execute(
            f"""
            INSERT INTO {EVENT} ({_EVENT_COLUMNS})
            SELECT id, {d.now}, %s, 'rejected', status, reason, version, %s, %s,
                lease_expires_at, {detail}
            FROM {RUN} WHERE id = %s
            """,
            [kind, token, owner, why if why is not None else str(token), run_id],
        )

    # -- refusals recorded by the gates ------------------------------------------------------

    def refuse(
        self,
        task_id: str,
        task_name: str,
        retries: int,
        status: Status,
        reason: str,
        detail: str,
        deadline: datetime | None,
        *,
        confirm_within: timedelta | None = None,
    ) -> bool:
        """A gate refused a message: end its run, unless another worker owns it now.

        ``confirm_within``: a refusal for the deadline; a recorded run ends only if its
        deadline is within this much of the database clock's now (the reserve), so a
        worker whose clock runs ahead cannot expire a run that is still in time. A run
        with no row (published by name, or before the app was installed) gets one,
        already ended. Returns whether this call ended the run.
        """
        d = self.dialect
        confirm, confirm_params = "", []
        if confirm_within is not None:
            confirm = f"AND deadline IS NOT NULL AND deadline <= {d.now_plus}"
            confirm_params = [d.seconds(confirm_within)]
        count, _ = self.execute(
            f"""
            UPDATE {RUN} SET status = %s, reason = %s, detail = %s, owner = '',
                lease_expires_at = NULL, version = version + 1, op = 'refuse',
                op_detail = %s, updated_at = {d.now}
            WHERE task_id = %s AND retries = %s
              AND (status IN {_CLAIMABLE_SQL}
                   OR (status = 'RUNNING' AND lease_expires_at <= {d.now}))
              AND NOT {_HAS_UNRESOLVED}
              {confirm}
            """,
            [status.value, reason, detail, detail, task_id, retries, *confirm_params],
        )
        if count:
            return True  # (a recorded run still in time by the database clock is left)
        unrecorded = NewRun(task_id, task_name, deadline, None, "", "", retries, None, None, "", "")
        return self._record_ended(unrecorded, status, reason, detail, "refuse", published=True)

    # -- the worker's main process, about its own pool processes ------------------------------

    def end_owned(
        self, task_id: str, owner: str, status: Status, reason: str, detail: str
    ) -> str | None:
        """End the attempt a pool process of this worker holds (its hard time limit hit).

        The main process supervises the pool process that owns the lease, so it may end
        that attempt; the token is bumped, which fences the killed process for good. If
        the attempt had dispatched an effect without recording its outcome, the run
        ends UNKNOWN instead (seed 004: a deadline during a provider call is an outcome
        to reconcile, not to guess), and those effects are marked UNKNOWN. Returns the
        status written, or ``None`` if the attempt was not this owner's any more.
        """
        d = self.dialect
        _, rows = self.execute(
            f"""
            UPDATE {RUN} SET
                status = CASE WHEN {_HAS_UNRESOLVED} THEN 'UNKNOWN' ELSE %s END,
                reason = CASE WHEN {_HAS_UNRESOLVED} THEN 'effect_unresolved' ELSE %s END,
                detail = %s, lease_token = lease_token + 1, lease_expires_at = NULL,
                version = version + 1, op = 'end_owned', op_detail = %s, updated_at = {d.now}
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
        """Let the lease of a lost pool process lapse now, for the reconciler to settle."""
        d = self.dialect
        count, _ = self.execute(
            f"""
            UPDATE {RUN} SET lease_expires_at = {d.now_plus}, version = version + 1,
                op = 'worker_lost', op_detail = %s, updated_at = {d.now}
            WHERE task_id = %s AND status = 'RUNNING' AND owner = %s
            """,
            [d.seconds(-SUPERVISOR_GRACE), detail, task_id, owner],
        )
        return count == 1

    # -- operator actions (the admin) ---------------------------------------------------------

    def expire_now(self, run_id: int, operator: str) -> bool:
        """End an unfinished run at once; its holder, if any, is fenced (token + 1)."""
        d = self.dialect
        detail = f"expired by {operator}"
        count, _ = self.execute(
            f"""
            UPDATE {RUN} SET status = 'EXPIRED', reason = 'expired_by_operator', detail = %s,
                lease_token = lease_token + 1, lease_expires_at = NULL,
                version = version + 1, op = 'expire_now', op_detail = %s, updated_at = {d.now}
            WHERE id = %s AND status NOT IN {_TERMINAL_SQL}
            """,
            [detail, detail, run_id],
        )
        return count == 1

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
              AND (status IN ('QUEUED', 'RETRYING', 'CLOCK_UNCERTAIN', 'PAUSED', 'UNKNOWN',
                              'FAILED')
                   OR (status = 'RUNNING' AND lease_expires_at <= {d.now}))
              AND (deadline IS NULL OR deadline > {d.now})
              AND message_body IS NOT NULL
              AND NOT {_HAS_UNRESOLVED}
            """,
            [detail, detail, run_id],
        )
        return count == 1

    # -- reconciliation ----------------------------------------------------------------------

    def expire_unclaimed(self, limit: int = 500) -> list[Expired]:
        """End runs whose deadline passed before any worker claimed them
        (``expired_before_claim``), or while they were paused (``deadline_passed``)."""
        d = self.dialect
        _, rows = self.execute(
            f"""
            UPDATE {RUN} SET status = 'EXPIRED',
                reason = CASE WHEN status = 'PAUSED' THEN 'deadline_passed'
                              ELSE 'expired_before_claim' END,
                detail = CASE WHEN status = 'PAUSED'
                              THEN 'the deadline passed while the run was paused'
                              ELSE 'the deadline passed before any worker claimed the run'
                         END,
                version = version + 1, op = 'expire',
                op_detail = CASE WHEN status = 'PAUSED' THEN 'deadline_passed'
                                 ELSE 'expired_before_claim' END,
                updated_at = {d.now}
            WHERE id IN (
                SELECT id FROM {RUN}
                WHERE status IN {_WAITING_SQL} AND deadline <= {d.now}
                LIMIT %s
            ) AND status IN {_WAITING_SQL} AND deadline <= {d.now}
            RETURNING task_id, task_name, status, reason, deadline, detail
            """,
            [limit],
        )
        return [Expired(r[0], r[1], r[2], r[3], d.instant(r[4]), r[5]) for r in rows]

    def lapsed_leases(self, limit: int = 100) -> list[LapsedLease]:
        """Runs whose lease expired by the database clock (seed 000 steps 1 and 2).

        Only leases lapsed for :data:`SUPERVISOR_GRACE` already: a pool process killed by
        its hard time limit at the deadline (where its lease also ends) is settled by its
        own worker first, so the outcome does not depend on who is quicker.
        """
        d = self.dialect
        _, rows = self.execute(
            f"""
            SELECT id, task_id, task_name, version, lease_token, owner, lost_leases, deadline,
                deadline IS NOT NULL AND deadline <= {d.now}
            FROM {RUN}
            WHERE status = 'RUNNING' AND lease_expires_at <= {d.now_plus}
            ORDER BY lease_expires_at
            LIMIT %s
            """,
            [d.seconds(-SUPERVISOR_GRACE), limit],
        )
        return [
            LapsedLease(r[0], r[1], r[2], r[3], r[4], r[5], r[6], d.instant(r[7]), bool(r[8]))
            for r in rows
        ]

    def settle_lapsed(
        self, lapsed: LapsedLease, status: Status, reason: str, detail: str, *,
        unresolved: bool = False,
    ) -> bool:  # fmt: skip
        """End (or mark UNKNOWN) a run whose lease lapsed, if it has not changed since read
        and still has (``unresolved``) or has not an effect without a recorded outcome,
        as when the decision was taken."""
        d = self.dialect
        has = _HAS_UNRESOLVED if unresolved else f"NOT {_HAS_UNRESOLVED}"
        count, _ = self.execute(
            f"""
            UPDATE {RUN} SET status = %s, reason = %s, detail = %s,
                lease_token = lease_token + 1, lease_expires_at = NULL,
                version = version + 1, op = 'reconcile', op_detail = %s,
                updated_at = {d.now}
            WHERE id = %s AND version = %s AND status = 'RUNNING'
              AND lease_expires_at <= {d.now} AND {has}
            """,
            [status.value, reason, detail, detail, lapsed.run_id, lapsed.version],
        )
        return count == 1

    def requeue_lapsed(self, lapsed: LapsedLease) -> bool:
        """Give a lapsed run back to the queue with a fresh token (fences the old holder)."""
        d = self.dialect
        count, _ = self.execute(
            f"""
            UPDATE {RUN} SET status = 'QUEUED', lease_token = lease_token + 1, owner = '',
                lease_expires_at = NULL, lost_leases = lost_leases + 1,
                published_at = {d.now}, version = version + 1, op = 'requeue',
                op_detail = %s, updated_at = {d.now}
            WHERE id = %s AND version = %s AND status = 'RUNNING'
              AND lease_expires_at <= {d.now}
              AND (deadline IS NULL OR deadline > {d.now})
              AND NOT {_HAS_UNRESOLVED}
            """,
            [f"lease of {lapsed.owner} (token {lapsed.token}) lapsed", lapsed.run_id,
             lapsed.version],
        )  # fmt: skip
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
            f"""
            SELECT {_MESSAGE_COLUMNS}
            FROM {RUN}
            WHERE status IN {_CLAIMABLE_SQL}
              AND ((published_at <= {d.now_plus}
                    AND (available_at IS NULL OR available_at <= {d.now_plus}))
                   OR (status = 'CLOCK_UNCERTAIN' AND %s = 1))
              AND (deadline IS NULL OR deadline > {d.now})
            ORDER BY published_at
            LIMIT %s
            """,
            [d.seconds(-republish_after), d.seconds(-republish_after), int(held), limit],
        )
        return [self._message(row) for row in rows]

    def mark_republished(self, run_id: int, version: int) -> bool:
        """Claim the right to republish a run (one reconciler wins per version); a held
        (CLOCK_UNCERTAIN) run is QUEUED again."""
        d = self.dialect
        count, _ = self.execute(
            f"""
            UPDATE {RUN} SET published_at = {d.now}, version = version + 1,
                status = CASE WHEN status = 'CLOCK_UNCERTAIN' THEN 'QUEUED' ELSE status END,
                reason = CASE WHEN status = 'CLOCK_UNCERTAIN' THEN '' ELSE reason END,
                op = 'republish', op_detail = '', updated_at = {d.now}
            WHERE id = %s AND version = %s AND status IN {_CLAIMABLE_SQL}
            """,
            [run_id, version],
        )
        return count == 1

    def message_of(self, run_id: int) -> Unclaimed | None:
        """A run's outbox message (for a requeue)."""
        _, rows = self.execute(
            f"""
            SELECT {_MESSAGE_COLUMNS}
            FROM {RUN} WHERE id = %s
            """,
            [run_id],
        )
        return self._message(rows[0]) if rows else None

    def _message(self, row: tuple[Any, ...]) -> Unclaimed:
        """An :class:`Unclaimed` from a row of :data:`_MESSAGE_COLUMNS`."""
        run_id, task_id, name, version, retries, available_at, body, ctype, encoding = row
        return Unclaimed(
            run_id, task_id, name, version, retries, self.dialect.instant(available_at),
            _bytes(body), ctype, encoding,
        )  # fmt: skip

    def database_now(self) -> datetime:
        """The database clock."""
        d = self.dialect
        _, rows = self.execute(f"SELECT {d.now}", [], timed=True)
        return _required(d.instant(rows[0][0]))


@dataclass(frozen=True)
class LapsedLease:
    run_id: int
    task_id: str
    task_name: str
    version: int
    token: int
    owner: str
    lost_leases: int
    deadline: datetime | None
    past_deadline: bool


@dataclass(frozen=True)
class Unclaimed:
    run_id: int
    task_id: str
    task_name: str
    version: int
    retries: int
    available_at: datetime | None
    message_body: bytes | None
    content_type: str
    content_encoding: str


#: The columns :meth:`Store._message` reads (a run's outbox message).
_MESSAGE_COLUMNS: Final = (
    "id, task_id, task_name, version, retries, available_at, message_body, content_type, "
    "content_encoding"
)
_EVENT_COLUMNS: Final = (
    "run_id, at, kind, outcome, status, reason, version, lease_token, owner, "
    "lease_expires_at, detail"
)


def _json(value: Any) -> Any:
    if isinstance(value, (str, bytes)):
        return json.loads(value)
    return value


def _required(value: datetime | None) -> datetime:
    if value is None:
        raise ValueError("the database returned no clock reading")
    return value


def _bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    return bytes(value)
