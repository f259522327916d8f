"""Helpers for testing code that uses celery-deadlines (public, stable).

``FakeClock`` is a clock you move by hand: ``advance()`` moves both readings (time
passing), ``jump_wall()`` moves only the wall clock (NTP step, VM resume), which is how
tests prove that enforcement runs on the monotonic clock.

``FakeLedger`` is the run ledger's contract in memory (``use_ledger(FakeLedger())``):
DeadlineTask records, claims, fences and ends its runs there by the database ledger's
rules, so task code's ledger paths are unit-tested without a database (the idea of
procrastinate's in-memory connector). Effects and stored plans need the real ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, NoReturn

from .clock import get_clock, set_clock
from .rules.records import ClaimRefused, Lease
from .rules.states import TERMINAL


class FakeClock:
    """A :class:`celery_deadlines.clock.Clock` that only moves when told to."""

    def __init__(self, start: datetime | None = None, monotonic: float = 1_000.0) -> None:
        # A fixed instant after any real "now" this code will meet, so that Celery's own
        # checks (which read the real clock) never see a fake deadline as already past.
        start = start or datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError("FakeClock needs an aware start instant")
        self._now = start.astimezone(UTC)
        self._monotonic = monotonic

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float = 0.0, **delta: float) -> None:
        """Let time pass: both clocks move forward together."""
        step = timedelta(seconds=seconds, **delta)
        if step < timedelta(0):
            raise ValueError("time does not pass backwards; use jump_wall()")
        self._now += step
        self._monotonic += step.total_seconds()

    def jump_wall(self, seconds: float) -> None:
        """Step the wall clock only (either way); the monotonic clock does not notice."""
        self._now += timedelta(seconds=seconds)


@contextmanager
def use_clock(clock: FakeClock) -> Iterator[FakeClock]:
    """Install ``clock`` for the duration of the block."""
    previous = set_clock(clock)
    try:
        yield clock
    finally:
        set_clock(previous)


# -- an in-memory run ledger -----------------------------------------------------------


@dataclass
class FakeRun:
    """One run in a :class:`FakeLedger`: what the ledger's row says."""

    task_id: str
    task_name: str
    deadline: datetime | None
    retries: int = 0
    status: str = "QUEUED"
    reason: str = ""
    detail: str = ""
    token: int = 0
    owner: str = ""
    attempt: int = 0
    lost_leases: int = 0
    lease_expires_at: datetime | None = None
    checkpoint: tuple[str, Any] | None = None
    #: the recorded message: (body, content type, encoding)
    message: tuple[bytes, str, str] | None = None
    #: ``(kind, outcome, detail)`` of every write asked of the run, applied or rejected
    events: list[tuple[str, str, str]] = field(default_factory=list)


class FakeLedger:
    """The run ledger's contract in memory, for unit tests of task code without a database.

    Install it with :func:`use_ledger`: DeadlineTask then records, claims, fences and
    ends runs here by the same rules as the database's ledger (one claim per run and
    token, a stale attempt's write refused, a refused claim's reason, the outbox row
    before the message). Time is the installed clock's (use :class:`FakeClock`). The
    effect ledger and stored plans are not played: test those against a database.
    """

    _MAX_LOST_LEASES: Final = 2

    def __init__(self) -> None:
        from .ledger import api

        self._api = api
        self.runs: dict[str, FakeRun] = {}

    def run(self, task_id: str) -> FakeRun:
        """The run of ``task_id`` (``KeyError`` if the ledger never saw it)."""
        return self.runs[task_id]

    def lapse(self, task_id: str) -> None:
        """Let the run's lease lapse now, as a worker lost or paused past its TTL would."""
        run = self.runs[task_id]
        run.lease_expires_at = get_clock().now() - timedelta(seconds=1)

    # -- the entry point's contract (celery_deadlines.ledger.api) -------------------------

    def encode_message(
        self, serializer: str, args: Any, kwargs: Any, options: dict[str, Any]
    ) -> tuple[bytes, str, str]:
        return self._api.encode_message(serializer, args, kwargs, options)

    def record_run(self, app: Any, run: Any, send: Callable[[], Any]) -> Any:
        known = self.runs.get(run.task_id)
        if known is not None:  # a reused id: the same run again, or a conflict
            existing = self._api.ExistingRun(
                task_id=run.task_id,
                task_name=known.task_name,
                status=known.status,
                message_body=known.message[0] if known.message else None,
                content_type=known.message[1] if known.message else "",
                content_encoding=known.message[2] if known.message else "",
            )
            accept = self._api.readable_by_workers(app, run.task_name)
            self._api.check_repeat(existing, run, accept=accept)
            return None
        recorded = self._record(run.task_id, run.task_name, run.deadline, run.retries)
        if run.message_body is not None:
            recorded.message = (run.message_body, run.content_type, run.content_encoding)
        return send()

    def hand_to_retry(
        self,
        attempt: FakeAttempt,
        *,
        retries: int,
        available_at: datetime | None,
        message_body: bytes,
        send: Callable[[], Any],
    ) -> Any:
        attempt.retry(retries, available_at, message_body, f"retries={retries}")
        return send()

    def claim_run(
        self,
        app: Any,
        *,
        task_id: str,
        retries: int,
        hostname: str | None,
        ttl: timedelta,
        reserve: timedelta,
        unrecorded: Callable[[], Any],
    ) -> Any:
        if task_id not in self.runs:
            row = unrecorded()
            self._record(row.task_id, row.task_name, row.deadline, row.retries)
        run = self.runs[task_id]
        now = get_clock().now()
        owner = f"{hostname or 'unknown'}:fake"
        why = self._claim_refusal(run, retries, now, reserve)
        if why is not None:
            run.events.append(("claim", "rejected", why))
            return ClaimRefused(
                why=why,
                status=run.status,
                token=run.token,
                owner=run.owner,
                lease_expires_at=run.lease_expires_at,
                database_now=now,
            )
        if run.status == "RUNNING":
            run.lost_leases += 1
        run.status, run.owner, run.token, run.attempt = (
            "RUNNING",
            owner,
            run.token + 1,
            run.attempt + 1,
        )
        expires = now + ttl
        run.lease_expires_at = expires if run.deadline is None else min(expires, run.deadline)
        run.events.append(("claim", "applied", f"retries={retries}"))
        lease = Lease(
            run_id=id(run),
            task_id=task_id,
            token=run.token,
            version=run.token,
            attempt=run.attempt,
            expires_at=run.lease_expires_at,
            deadline=run.deadline,
            checkpoint_name=run.checkpoint[0] if run.checkpoint else "",
            checkpoint_data=run.checkpoint[1] if run.checkpoint else None,
            database_now=now,
            waiting_since=None,
        )
        return FakeAttempt(self, lease, owner, ttl)

    def refuse_run(
        self,
        app: Any,
        *,
        task_id: str,
        task_name: str,
        retries: int,
        status: str,
        reason: str,
        detail: str,
        deadline: datetime | None,
        confirm_within: timedelta | None,
        dedicated: bool = True,
    ) -> bool:
        run = self.runs.get(task_id)
        now = get_clock().now()
        if run is None:
            run = self._record(task_id, task_name, deadline, retries)
        live = run.status == "RUNNING" and (run.lease_expires_at or now) > now
        ended = run.status in TERMINAL
        in_time = confirm_within is not None and (
            run.deadline is None or run.deadline > now + confirm_within
        )
        if live or ended or in_time or run.retries != retries:
            run.events.append(("refuse", "rejected", reason))
            return False
        run.status, run.reason, run.detail, run.owner = str(status), reason, detail, ""
        run.events.append(("refuse", "applied", reason))
        return True

    def end_owned(self, app: Any, **_: Any) -> str | None:
        return None  # no pool processes here

    def ended_run(self, app: Any, task_id: str) -> Any:
        run = self.runs.get(task_id)
        if run is None or run.status not in TERMINAL:
            return None
        return self._api.Expired(
            task_id=task_id,
            task_name=run.task_name,
            status=run.status,
            reason=run.reason,
            deadline=run.deadline,
            detail=run.detail,
        )

    def tell_caller_unknown(self, app: Any, task_id: str, error: str) -> None:
        pass  # no effects here: a run never ends UNKNOWN in the fake ledger

    def lapse_owned(self, app: Any, task_id: str, *_: Any) -> bool:
        self.lapse(task_id)
        return True

    # -- the rules --------------------------------------------------------------------------

    def _record(
        self, task_id: str, task_name: str, deadline: datetime | None, retries: int
    ) -> FakeRun:
        run = self.runs.setdefault(task_id, FakeRun(task_id, task_name, deadline, retries))
        run.events.append(("enqueue", "applied", ""))
        return run

    def _claim_refusal(
        self, run: FakeRun, retries: int, now: datetime, reserve: timedelta
    ) -> str | None:
        """The claim's condition, in the database ledger's order."""
        lapsed = run.lease_expires_at is not None and run.lease_expires_at <= now
        if run.status in TERMINAL:
            return "terminal"
        if run.retries != retries:
            return "stale_message"
        if run.deadline is not None and run.deadline <= now:
            return "deadline_passed"
        if run.deadline is not None and run.deadline <= now + reserve:
            return "deadline"
        if run.status == "RUNNING" and not lapsed:
            return "held"
        if run.status == "RUNNING" and run.lost_leases >= self._MAX_LOST_LEASES:
            return "lost_leases"
        if run.status == "UNKNOWN":
            return "unknown"
        if run.status not in ("QUEUED", "RETRYING", "CLOCK_UNCERTAIN", "RUNNING"):
            return "changed"
        return None


class FakeAttempt:
    """A claimed attempt in a :class:`FakeLedger`: every write fenced by its token."""

    def __init__(self, ledger: FakeLedger, lease: Any, owner: str, ttl: timedelta) -> None:
        self.ledger = ledger
        self.lease = lease
        self.owner = owner
        self.ttl = ttl
        self.lost = False
        self.reading = None
        self.unresolved: set[str] = set()

    @property
    def last_checkpoint(self) -> tuple[str, Any] | None:
        name = self.lease.checkpoint_name
        return (name, self.lease.checkpoint_data) if name else None

    @property
    def store(self) -> Any:
        raise NotImplementedError(
            "the fake ledger plays runs only: test effects, plans and the ledger's clock "
            "against a database (celery_deadlines' own tests do, on SQLite and PostgreSQL)"
        )

    def start(self) -> None:
        """No heartbeat: the test moves the clock, and lapses leases with ``lapse()``."""

    def stop(self) -> None:
        pass

    def checkpoint(self, name: str, data: Any) -> None:
        self._write("checkpoint", checkpoint=(name, data))

    def succeed(self) -> None:
        self._write("succeeded", status="SUCCEEDED", lease_expires_at=None)

    def end(self, status: Any, reason: str, detail: str) -> None:
        self._write(
            str(status).lower(),
            status=str(status),
            reason=reason,
            detail=detail,
            lease_expires_at=None,
        )

    def retry(
        self, retries: int, available_at: datetime | None, body: bytes | None, detail: str
    ) -> None:
        self._write("retry", status="RETRYING", retries=retries, lease_expires_at=None)

    def release(self, detail: str) -> None:
        self._write("release", status="QUEUED", lease_expires_at=None)

    def check(self, written: bool, write: str) -> None:
        if not written:
            self._refused(write)

    def _write(self, kind: str, **changes: Any) -> None:
        run = self.ledger.runs[self.lease.task_id]
        now = get_clock().now()
        alive = run.lease_expires_at is not None and run.lease_expires_at > now
        if run.token != self.lease.token or run.status != "RUNNING" or not alive:
            run.events.append((kind, "rejected", f"stale token {self.lease.token}"))
            self._refused(kind)
        for name, value in changes.items():
            setattr(run, name, value)
        run.events.append((kind, "applied", ""))

    def _refused(self, write: str) -> NoReturn:
        from .errors import StaleLease
        from .signals import write_refused

        self.lost = True
        write_refused.send(sender=self, task_id=self.lease.task_id, write=write)
        raise StaleLease(self.lease.task_id, self.lease.token, write)


@contextmanager
def use_ledger(ledger: FakeLedger) -> Iterator[FakeLedger]:
    """Run DeadlineTasks against ``ledger`` for the duration of the block (any app)."""
    from . import ledger as the_ledger

    previous = the_ledger.install(ledger)
    try:
        yield ledger
    finally:
        the_ledger.install(previous)
