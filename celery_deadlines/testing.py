"""Helpers for testing code that uses celery-deadlines (public, stable).

``FakeClock`` is a clock you move by hand: ``advance()`` moves both readings (time
passing), ``jump_wall()`` moves only the wall clock (NTP step, VM resume), which is how
tests prove that enforcement runs on the monotonic clock.

``FakeLedger`` is the run ledger's contract in memory (``use_ledger(FakeLedger())``):
DeadlineTask records, claims, fences and ends its runs there by the database ledger's
rules, and guards its effects (``self.effect(...)``) as the effect ledger does, so task
code's ledger paths are unit-tested without a database (the idea of procrastinate's
in-memory connector). Eager runs (``apply()``, ``task_always_eager``) are recorded and
claimed there as in the database's ledger, so a body's effects run eagerly, once per
key. Stored plans, the reconciler and the purge need the real ledger.
tests/django/test_ledger_contract.py holds the fake to the SQLite and PostgreSQL ledgers;
:mod:`celery_deadlines.pytest_plugin` installs a fresh one for every test of a suite.

Importing this module gives ``DeadlineTask`` the ``__call__`` a ledger writes outcomes
through (:func:`celery_deadlines.task.graft_call_onto_deadline_task`): import it (or load
the pytest plugin) before a test's worker starts, or the import raises
:class:`~celery_deadlines.errors.ConfigurationError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, NoReturn

from . import conf
from .clock import get_clock, set_clock
from .conf import settings_for
from .rules.limits import claim_detail
from .rules.outcomes import needing_an_operator, unknown_meta
from .rules.records import ENDED_IT, ClaimRefused, Lease, Recorded, Refusal
from .rules.states import (
    CALLER_UNKNOWN,
    CLAIMABLE,
    COMPLETED,
    DISPATCHABLE,
    TERMINAL,
    UNRESOLVED,
    EffectState,
)
from .signals import report_operator_needed
from .task import graft_call_onto_deadline_task

__all__ = ["FakeClock", "FakeLedger", "use_clock", "use_ledger"]

# A test installs this module's ledger (use_ledger) at any time, a worker thread of the
# test's process may already be running: DeadlineTask's tracers must hand it attempts
# from the start (a tracer built before would never write a claimed run's outcome).
graft_call_onto_deadline_task()


class FakeClock:
    """A clock that only moves when told to (install it with :func:`use_clock`).

    ``start``: the wall clock's first instant (aware; default 2030-01-01 12:00 UTC, after
    any real now, so that Celery's own checks never find a fake deadline past);
    ``monotonic``: the monotonic clock's first reading. Raises ``ValueError`` for a naive
    ``start``.
    """

    def __init__(self, start: datetime | None = None, monotonic: float = 1_000.0) -> None:
        # A fixed instant after any real "now" this code will meet, so that Celery's own
        # checks (which read the real clock) never see a fake deadline as already past.
        start = start or datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError("FakeClock needs an aware start instant")
        self._now = start.astimezone(UTC)
        self._monotonic = monotonic

    def now(self) -> datetime:
        """The wall clock: an aware UTC datetime."""
        return self._now

    def monotonic(self) -> float:
        """The monotonic clock, in seconds."""
        return self._monotonic

    def advance(self, seconds: float = 0.0, **delta: float) -> None:
        """Let time pass: both clocks move forward together, by ``seconds`` plus any
        ``timedelta`` keywords (``minutes=2``). Raises ``ValueError`` for a step back
        (use :meth:`jump_wall`)."""
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
    """Make ``clock`` the library's clock for the duration of the block, and yield it;
    the previous clock is back after it."""
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
    #: a success's kept return value (``KeptResult``), as the completion wrote it
    result: Any = None
    #: a failed body's traceback, bounded, as the run's end wrote it
    traceback: str | None = None
    #: refused at its publish, never sent: a publish under its id again is a new try
    refused_unsent: bool = False
    #: ``(kind, outcome, detail)`` of every write asked of the run, applied or rejected
    events: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass
class FakeEffect:
    """One effect in a :class:`FakeLedger`: what the effect ledger's row says."""

    key: str
    #: the run that recorded it, or dispatched it last (its ``task_id``)
    task_id: str
    name: str
    kind: str
    fingerprint: str
    lease_token: int
    state: str = EffectState.INTENT_RECORDED
    #: the key's dispatch number: a fencing token per key
    dispatches: int = 0
    result: Any = None
    error: str = ""


class FakeLedger:
    """The run ledger's contract in memory, for unit tests of task code without a database.

    Install it with :func:`use_ledger`: DeadlineTask then records, claims, fences and
    ends runs here by the same rules as the database's ledger (one claim per run and
    token, a stale attempt's write refused, a refused claim's reason, the outbox row
    before the message, an effect dispatched at most once per key, a run with an effect
    of unknown outcome ended UNKNOWN). Eager runs (``apply()``, ``task_always_eager``)
    are recorded and claimed here as there, and an eager retry is handed its run as a
    worker's retry message is. Time is the installed clock's (use :class:`FakeClock`).
    Stored plans, the reconciler and the purge are not played: test those against a
    database.
    """

    #: How long a lapsed lease is left to the worker that supervised it before another
    #: claim takes it over (the database ledger's ``SUPERVISOR_GRACE``).
    SUPERVISOR_GRACE: Final = timedelta(seconds=1)

    def __init__(self) -> None:
        from .ledger import api

        self._api = api
        self.runs: dict[str, FakeRun] = {}
        #: the effect ledger, by key
        self.effects: dict[str, FakeEffect] = {}

    def unresolved(self, task_id: str) -> list[str]:
        """The keys of the run's effects dispatched without a recorded outcome."""
        return [
            effect.key
            for effect in self.effects.values()
            if effect.task_id == task_id and effect.state in UNRESOLVED
        ]

    def holds(self, lease: Lease) -> bool:
        """Whether ``lease`` still holds its run: its token current, the run RUNNING and
        the lease alive (the condition of every fenced write and the dispatch guard)."""
        run = self.runs.get(lease.task_id)
        now = get_clock().now()
        return (
            run is not None
            and run.token == lease.token
            and run.owner == lease.owner
            and run.status == "RUNNING"
            and run.lease_expires_at is not None
            and run.lease_expires_at > now
        )

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

    def record_run(self, app: Any, run: Any, *, publisher: Any = None) -> Recorded:
        known = self.runs.get(run.task_id)
        if known is not None:  # a reused id: the same run again, or a conflict
            self._check_repeat(app, run, known)
            if not known.refused_unsent:
                return Recorded.ALREADY
            del self.runs[run.task_id]  # the caller tries again: recorded anew
        recorded = self._record(run.task_id, run.task_name, run.deadline, run.retries)
        if run.message_body is not None:
            recorded.message = (run.message_body, run.content_type, run.content_encoding)
        return Recorded.NOW  # in memory there is no transaction to wait for

    def publish_failed(self, app: Any, task_id: str, error: BaseException) -> None:
        pass  # the run stays as it was recorded: no sweeper publishes it again in memory

    def send_at_commit(self, app: Any, send: Callable[[], None]) -> None:
        send()  # never asked: record_run never answers AT_COMMIT

    def eager_run(self, app: Any) -> AbstractContextManager[None]:
        return nullcontext()  # no connection to choose in memory

    def record_eager_run(self, app: Any, run: Any) -> None:
        known = self.runs.get(run.task_id)
        if known is None:
            self.record_run(app, run)
        else:  # the same run again (its claim decides), or a conflict
            self._check_repeat(app, run, known)

    def _check_repeat(self, app: Any, run: Any, known: FakeRun) -> None:
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

    def hand_to_retry(
        self,
        attempt: FakeAttempt,
        *,
        retries: int,
        available_at: datetime | None,
        message_body: bytes,
    ) -> None:
        attempt.retry(retries, available_at, message_body, f"retries={retries}")

    def claim_run(
        self,
        app: Any,
        *,
        task_id: str,
        task_name: str,
        retries: int,
        hostname: str | None,
        ttl: timedelta,
        reserve: timedelta,
        unrecorded: Callable[[], Any],
        exclusive: bool = False,  # nothing to flush in memory
        eager: bool = False,  # one store in memory
        limits: Any = None,
    ) -> Any:
        if task_id not in self.runs:
            row = unrecorded()
            self._record(row.task_id, row.task_name, row.deadline, row.retries)
        run = self.runs[task_id]
        now = get_clock().now()
        owner = f"{hostname or 'unknown'}:fake"
        max_lost = settings_for(app).get(conf.MAX_LOST_LEASES)
        why = self._claim_refusal(run, task_name, retries, now, reserve, max_lost)
        if why is not None:
            mismatch = why == ClaimRefused.TASK_MISMATCH
            run.events.append(("claim", "rejected", f"{why}:{task_name}" if mismatch else why))
            return ClaimRefused(
                why=why,
                status=run.status,
                token=run.token,
                owner="" if mismatch else run.owner,
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
        run.events.append(("claim", "applied", claim_detail(retries, limits)))
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
            owner=owner,
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
    ) -> Refusal:
        run = self.runs.get(task_id)
        now = get_clock().now()
        if run is None:  # published by name: its run is recorded already ended
            run = self._record(task_id, task_name, deadline, retries)
            run.status, run.reason, run.detail = str(status), reason, detail
            return ENDED_IT
        if run.task_name != task_name:  # another task's run: left as it is
            run.events.append(("refuse", "rejected", f"{ClaimRefused.TASK_MISMATCH}:{task_name}"))
            return Refusal(Refusal.TASK_MISMATCH)
        live = run.status == "RUNNING" and (run.lease_expires_at or now) > now
        waiting = run.status in CLAIMABLE or (run.status == "RUNNING" and not live)
        # a deadline refusal ends a recorded run only if the ledger's clock agrees
        confirmed = confirm_within is None or (
            run.deadline is not None and run.deadline <= now + confirm_within
        )
        unresolved = bool(self.unresolved(task_id))
        if not waiting or unresolved or not confirmed or run.retries != retries:
            run.events.append(("refuse", "rejected", reason))
            # why not, in the database ledger's order (ledger/sql/runs.py, _not_ended)
            if run.status in TERMINAL:
                return Refusal(Refusal.ALREADY_ENDED, run.status, run.reason)
            if run.retries != retries:
                return Refusal(Refusal.NOT_ENDED, run.status, run.reason)
            if live:
                return Refusal(Refusal.OWNED, run.status, run.reason, owner=run.owner)
            if not confirmed:
                return Refusal(
                    Refusal.NOT_CONFIRMED,
                    run.status,
                    run.reason,
                    deadline=run.deadline,
                    database_now=now,
                )
            return Refusal(Refusal.NOT_ENDED, run.status, run.reason)
        run.status, run.reason, run.detail, run.owner = str(status), reason, detail, ""
        run.lease_expires_at = None
        run.events.append(("refuse", "applied", reason))
        return ENDED_IT

    def refuse_publish(
        self,
        app: Any,
        *,
        task_id: str,
        task_name: str,
        reason: str,
        detail: str,
        deadline: datetime | None,
    ) -> bool:
        if task_id in self.runs:  # a run recorded under the id stands as it is
            return False
        run = self._record(task_id, task_name, deadline, 0)
        run.status, run.reason, run.detail = "EXPIRED", reason, detail
        run.refused_unsent = True
        run.events.append(("refuse_publish", "applied", reason))
        return True

    def end_owned(self, app: Any, **_: Any) -> str | None:
        return None  # no pool processes here

    def ended_run(self, app: Any, task_id: str) -> Any:
        run = self.runs.get(task_id)
        if run is None or run.status not in TERMINAL:
            return None
        return self._api.EndedRun(
            task_id=task_id,
            task_name=run.task_name,
            status=run.status,
            reason=run.reason,
            deadline=run.deadline,
            detail=run.detail,
            result=run.result if run.status == "SUCCEEDED" else None,
        )

    def keep_result(self, app: Any, value: Any) -> Any:
        return self._api.keep_result(app, value)

    def read_result(self, app: Any, kept: Any) -> Any:
        return self._api.read_result(app, kept)

    def tell_caller_unknown(self, app: Any, task_id: str, error: str, task_name: str = "") -> None:
        if task_id not in self.runs:
            return
        meta = unknown_meta(self.unresolved(task_id), error)
        app.backend.store_result(task_id, meta, CALLER_UNKNOWN)
        task = app.tasks.get(task_name) if task_name else None
        if task is not None:
            names = {key: self.effects[key].name for key in self.unresolved(task_id)}
            alone = needing_an_operator(names, lambda name: bool(task.effect_reconciler(name)))
            if alone:
                report_operator_needed(task, task_id, task_name, alone, error)

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
        self,
        run: FakeRun,
        task_name: str,
        retries: int,
        now: datetime,
        reserve: timedelta,
        max_lost: int,
    ) -> str | None:
        """The claim's condition, in the database ledger's order (the ``claim`` statement's
        ``WHERE``, ``ledger/sql/runs.sql``)."""
        live = run.status == "RUNNING" and (run.lease_expires_at or now) > now
        # a lapsed lease is taken over only after the grace: its supervisor ends it first
        held = run.status == "RUNNING" and (
            run.lease_expires_at is None or run.lease_expires_at > now - self.SUPERVISOR_GRACE
        )
        if run.task_name != task_name:
            return ClaimRefused.TASK_MISMATCH
        if run.status in TERMINAL:
            return ClaimRefused.TERMINAL
        if run.retries != retries:
            return ClaimRefused.STALE_MESSAGE
        if self.unresolved(run.task_id) and not live:  # reconcile first
            return ClaimRefused.UNRESOLVED
        if run.deadline is not None and run.deadline <= now:
            return ClaimRefused.DEADLINE_PASSED
        if run.deadline is not None and run.deadline <= now + reserve:
            return ClaimRefused.DEADLINE
        if held:
            return ClaimRefused.HELD
        if run.status == "RUNNING" and run.lost_leases >= max_lost:
            return ClaimRefused.LOST_LEASES
        if run.status == "UNKNOWN":
            return ClaimRefused.UNKNOWN
        if run.status not in CLAIMABLE and run.status != "RUNNING":
            return ClaimRefused.CHANGED
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
        self.effect_names: dict[str, str] = {}
        self.performed: dict[str, str] = {}
        self.deadline_at: float | None = None
        #: as the ledger's attempt: told a cancel's deadline (nothing cancels in memory)
        self.pulled_in: Any = None
        self.cancelled = False
        self.termination: Any = None

    @property
    def last_checkpoint(self) -> tuple[str, Any] | None:
        name = self.lease.checkpoint_name
        return (name, self.lease.checkpoint_data) if name else None

    @property
    def store(self) -> _FakeStore:
        """The part of the ledger's store task code reaches through the attempt: the
        effect ledger and rejected writes."""
        return _FakeStore(self.ledger)

    def database_now(self) -> datetime:
        """The ledger's clock: the installed one."""
        return get_clock().now()

    def active_plan(self) -> NoReturn:
        _no_plans()

    def save_plan(self, plan_id: str, document: dict[str, Any]) -> NoReturn:
        _no_plans()

    def invalidate_plan(self, row_id: int, reason: str, detail: str) -> NoReturn:
        _no_plans()

    @property
    def effects(self) -> FakeEffects:
        """The effect ledger (what :class:`~celery_deadlines.core.effects.EffectScope` uses)."""
        return FakeEffects(self.ledger)

    def start(self) -> None:
        """No heartbeat: the test moves the clock, and lapses leases with ``lapse()``."""

    def stop(self) -> None:
        pass

    def checkpoint(self, name: str, data: Any) -> None:
        self._write("checkpoint", "checkpoint", checkpoint=(name, data))

    def patiently(self, what: str, write: Callable[[], Any], done: Any = None) -> Any:
        """The write at once: the in-memory ledger is never away."""
        return write()

    def succeed(self, result: Any = None) -> None:
        self._finish("SUCCEEDED", "", "", "succeed", result)

    def end(self, status: Any, reason: str, detail: str, traceback: str | None = None) -> None:
        self._finish(str(status), reason, detail, "finish", traceback=traceback)

    def _finish(
        self,
        status: str,
        reason: str,
        detail: str,
        write: str,
        result: Any = None,
        traceback: str | None = None,
    ) -> None:
        # an effect dispatched without an outcome ends the run UNKNOWN whatever ``status``
        # says: the attempt may not know of it, and it must be reconciled first
        if self.ledger.unresolved(self.lease.task_id):
            status, reason = "UNKNOWN", "effect_unresolved"
        changes = {
            "status": status,
            "reason": reason,
            "detail": detail,
            "result": result,
            "traceback": traceback,
        }
        self._write(status.lower(), write, **changes, lease_expires_at=None)

    def end_overrun(self, status: Any, reason: str, detail: str) -> str | None:
        """The run of a body past its deadline, ended by its own owner (the database
        ledger's :meth:`~celery_deadlines.ledger.attempt.Attempt.end_overrun`)."""
        run = self.ledger.runs.get(self.lease.task_id)
        if run is None or run.status != "RUNNING" or run.owner != self.owner:
            return None
        if self.ledger.unresolved(self.lease.task_id):
            status, reason = "UNKNOWN", "effect_unresolved"
        run.status, run.reason, run.detail = str(status), reason, detail
        run.token += 1
        run.lease_expires_at = None
        run.events.append(("end_owned", "applied", detail))
        return str(status)

    def retry(
        self, retries: int, available_at: datetime | None, body: bytes | None, detail: str
    ) -> None:
        self._write("retry", "retry", status="RETRYING", retries=retries, lease_expires_at=None)

    def release(self, detail: str) -> None:
        self._write("release", "release", status="QUEUED", lease_expires_at=None)

    def check(self, written: bool, write: str) -> None:
        if not written:
            self._refused(write)

    def _write(self, kind: str, write: str, **changes: Any) -> None:
        """A fenced write: the run's event ``kind``, refused as ``write`` (the name the
        database ledger's attempt gives it in :class:`StaleLease`)."""
        run = self.ledger.runs[self.lease.task_id]
        if not self.ledger.holds(self.lease):
            run.events.append((kind, "rejected", f"stale token {self.lease.token}"))
            self._refused(write)
        for name, value in changes.items():
            setattr(run, name, value)
        run.events.append((kind, "applied", ""))

    def _refused(self, write: str) -> NoReturn:
        from .errors import StaleLease
        from .signals import write_refused

        self.lost = True
        write_refused.send(sender=self, task_id=self.lease.task_id, write=write)
        raise StaleLease(self.lease.task_id, self.lease.token, write)


class FakeEffects:
    """The effect ledger's statements, in memory (``celery_deadlines.ledger.sql.effects``):
    at most one dispatch per key without a recorded outcome, the guard fenced by the
    run's token, its live lease and its deadline on the installed clock."""

    def __init__(self, ledger: FakeLedger) -> None:
        self.ledger = ledger

    def record_intent(
        self, lease: Lease, key: str, name: str, kind: str, fingerprint: str
    ) -> FakeEffect:
        """Record the intent to perform ``key``, or find it recorded (as it stands)."""
        found = FakeEffect(key, lease.task_id, name, kind, fingerprint, lease.token)
        return self.ledger.effects.setdefault(key, found)

    def dispatch(self, lease: Lease, key: str, fresh_until: datetime | None = None) -> int | None:
        """The dispatch guard: the key's dispatch number, or ``None`` (do not call out)."""
        effect = self.ledger.effects.get(key)
        if effect is None or effect.state not in DISPATCHABLE or self._refusal(lease, fresh_until):
            return None
        effect.state, effect.lease_token, effect.task_id = "DISPATCHED", lease.token, lease.task_id
        effect.dispatches += 1
        self._event(lease.task_id, "effect_dispatched", "applied", key)
        return effect.dispatches

    def why_refused(
        self, lease: Lease, key: str, owner: str, fresh_until: datetime | None = None
    ) -> str:
        """Why the guard refused ``key`` (recorded as a rejected ``dispatch``)."""
        effect = self.ledger.effects.get(key)
        if effect is None:
            return "changed"
        if effect.state in UNRESOLVED:
            why = "unresolved"
        elif effect.state in COMPLETED:
            why = "completed"
        else:
            why = self._refusal(lease, fresh_until) or "changed"
        self._event(lease.task_id, "dispatch", "rejected", f"{why}:{key}")
        return why

    def _refusal(self, lease: Lease, fresh_until: datetime | None) -> str | None:
        """What the guard finds wrong with the run, in the database ledger's order."""
        run = self.ledger.runs.get(lease.task_id)
        now = get_clock().now()
        if run is not None and run.deadline is not None and run.deadline <= now:
            return "deadline_passed"
        if not self.ledger.holds(lease):
            return "stale_lease"
        if fresh_until is not None and fresh_until <= now:
            return "stale_evidence"
        return None

    def _outcome(self, lease: Lease, key: str, state: str, **changes: Any) -> bool:
        # fenced by the run *and* its token: tokens count per run, and a key may pass
        # from one run to another
        effect = self.ledger.effects.get(key)
        if (
            effect is None
            or effect.task_id != lease.task_id
            or effect.lease_token != lease.token
            or effect.state not in UNRESOLVED
        ):
            return False
        effect.state = state
        for name, value in changes.items():
            setattr(effect, name, value)
        self._event(lease.task_id, f"effect_{state.lower()}", "applied", key)
        return True

    def succeed(self, lease: Lease, key: str, result: Any) -> bool:
        return self._outcome(lease, key, "SUCCEEDED", result=result)

    def fail(self, lease: Lease, key: str, error: str) -> bool:
        return self._outcome(lease, key, "FAILED", error=error)

    def not_sent(self, lease: Lease, key: str, error: str) -> bool:
        return self._outcome(lease, key, "NOT_DISPATCHED", error=error)

    def unknown(self, lease: Lease, key: str, error: str) -> bool:
        return self._outcome(lease, key, "UNKNOWN", error=error)

    def unresolved_keys(self, task_id: str) -> list[str]:
        return self.ledger.unresolved(task_id)

    def state_of(self, key: str) -> tuple[str, int, int] | None:
        effect = self.ledger.effects.get(key)
        return None if effect is None else (effect.state, effect.lease_token, effect.dispatches)

    def describe(self, key: str) -> str:
        """The effect as it stands: ``dispatch 2 (DISPATCHED, run r1, token 5)``."""
        effect = self.ledger.effects.get(key)
        if effect is None:
            return "gone"
        return (
            f"dispatch {effect.dispatches} ({effect.state}, run {effect.task_id}, "
            f"token {effect.lease_token})"
        )

    def _event(self, task_id: str, kind: str, outcome: str, detail: str) -> None:
        run = self.ledger.runs.get(task_id)
        if run is not None:
            run.events.append((kind, outcome, detail))


class _FakeRuns:
    """The run statements an effect's scope reaches: a rejected write's event."""

    def __init__(self, ledger: FakeLedger) -> None:
        self.ledger = ledger

    def record_rejected(
        self, run_id: int, kind: str, token: int, owner: str, why: str | None = None
    ) -> None:
        for run in self.ledger.runs.values():
            if id(run) == run_id:  # a fake lease's run id is its run's identity
                run.events.append((kind, "rejected", why or f"stale token {token}"))


class _FakeStore:
    """What an attempt's ``store`` offers task code in a :class:`FakeLedger`."""

    def __init__(self, ledger: FakeLedger) -> None:
        self.effects = FakeEffects(ledger)
        self.runs = _FakeRuns(ledger)


def _no_plans() -> NoReturn:
    raise NotImplementedError(
        "the fake ledger does not store plans: test them against a database "
        "(celery_deadlines' own tests do, on SQLite and PostgreSQL)"
    )


@contextmanager
def use_ledger(ledger: FakeLedger) -> Iterator[FakeLedger]:
    """Run DeadlineTasks against ``ledger`` for the duration of the block (any app, any
    thread of this process: a worker thread of ``celery.contrib.pytest`` too)."""
    from . import ledger as the_ledger

    previous = the_ledger.install(ledger)
    try:
        yield ledger
    finally:
        the_ledger.install(previous)
