"""Timezone-true schedules for Celery beat, reconciled by run id against the ledger.

In ``beat_schedule``, a :class:`ZonedSchedule` says "every weekday at 09:00
Europe/Berlin, done within 15 minutes"; run beat with :class:`DeadlineScheduler`::

    app.conf.beat_scheduler = "celery_deadlines.beat:DeadlineScheduler"
    app.conf.beat_schedule = {
        "digest": {
            "task": "shop.send_digest",
            "schedule": ZonedSchedule(
                LocalSchedule(time(9), "Europe/Berlin", timedelta(minutes=15), WEEKDAYS,
                              name="digest")
            ),
        },
    }

Each occurrence is resolved to UTC before its run exists (:mod:`celery_deadlines.rules.schedules`,
one DST policy) and published as the run ``occurrence.run_id`` with the occurrence's
window as its deadline; the run stores the instant, the zone and the local wall time.

Beat's own state (its ``celerybeat-schedule`` file) is only a hint. Whenever an entry is
due, and at start, the scheduler asks the ledger for the schedule's latest recorded
occurrence and looks at every occurrence since (at most ``catch_up`` back, default a
week; for a schedule the ledger has never seen, only those still within their window):
one with no run that is still within its window is published; one whose window closed
is recorded as ``EXPIRED`` / ``missed_occurrence``, never run late. A scheduler killed at any point,
restarted, or running twice, neither loses nor doubles an occurrence: the run id is
unique in the ledger, and a duplicate message for it is refused by the claim.

Needs the Django app (the ledger) in the beat process. The scheduler is a subclass of
Celery's default ``PersistentScheduler``; :class:`ZonedSchedulerMixin` brings the same
behaviour to another scheduler class whose entries carry a :class:`ZonedSchedule`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from celery.beat import PersistentScheduler, SchedulingError
from celery.schedules import BaseSchedule, schedstate

from . import conf
from .clock import get_clock
from .conf import settings_for
from .errors import ConfigurationError, DeadlineRefused
from .rules import skew, stamping, wire
from .rules.budgets import parse_duration
from .rules.contracts import is_deadline_task
from .rules.periodic import LeftOut, Periodic
from .rules.periodic import classify as periodic_classify
from .rules.periodic import occurrences as periodic_occurrences
from .rules.quoting import shown
from .rules.schedules import WEEKDAYS, Backlog, LocalSchedule, Occurrence, classify, occurrences
from .signals import clock_uncertain

logger = logging.getLogger("celery_deadlines")

#: Far enough ahead to find the next occurrence of any weekly schedule.
_HORIZON = timedelta(days=8)
_TICK = timedelta(microseconds=1)
#: How soon an entry with an unhandled occurrence is looked at again.
RETRY_PENDING = timedelta(seconds=5)
#: The most occurrences of one :class:`PeriodicSchedule` one pass publishes or records
#: (the latest; the ledger's bulk lookups stay within every database's parameter limit).
OCCURRENCE_LIMIT = 500
#: Headers a beat entry's ``headers`` may not set: Celery's own fields of the message
#: (:data:`stamping.PROTOCOL_HEADERS`: a header given to ``apply_async`` replaces each of
#: them, the message's id and task name included, so an entry could publish under another
#: run's id), and this package's (an entry's deadline is its window's).
DEADLINE_HEADERS = frozenset(
    {
        wire.DEADLINE_HEADER,
        wire.DELIVERY_DEADLINE_HEADER,
        wire.ORIGIN_HEADER,
        wire.SOURCE_HEADER,
        wire.OCCURRENCE_HEADER,
    }
)


def entry_headers(headers: Any) -> tuple[dict[str, Any], list[str]]:
    """The headers of a beat entry that are sent, and the names of those that are not
    (:func:`stamping.reserved_headers`, :data:`DEADLINE_HEADERS`)."""
    left = {*stamping.reserved_headers(headers), *(DEADLINE_HEADERS & headers.keys())}
    sent = {name: value for name, value in headers.items() if name not in left}
    return sent, sorted(str(name) for name in left)


class OccurrenceSchedule(BaseSchedule):
    """A beat schedule of named occurrences, each with a window, read on the library's
    clock: the part :class:`ZonedSchedule` and :class:`PeriodicSchedule` share, and what
    :func:`catch_up` reconciles against the ledger.

    ``is_due`` has no side effects (beat calls it to order its heap too): an entry is
    due while an occurrence in ``(handled_through, now]`` exists, where
    ``handled_through`` is what the scheduler last reconciled, at most ``catch_up`` ago.
    """

    #: the schedule's name in the ledger (the prefix of its run ids)
    name: str
    #: how long each occurrence has to be done in
    window: timedelta
    #: how far back the occurrences a restarted scheduler looks at go
    catch_up: timedelta

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        #: the instant through which every occurrence is published or recorded missed
        self.handled_through: datetime | None = None
        #: after a failed attempt (database away, clock in doubt): not due again before
        #: this, so beat waits instead of trying on every tick
        self.retry_at: datetime | None = None
        #: occurrences at or before this are not the schedule's (it did not exist yet, or
        #: said something else): neither published nor recorded missed
        self.floor: datetime | None = None
        #: why none of its occurrences is published (a django-celery-beat row refused
        #: when read): each is recorded missed, saying this, when it comes
        self.refused: str | None = None

    def occurrences(self, start: datetime, end: datetime) -> Iterator[Occurrence]:
        """Every occurrence with ``start <= at < end``, in order."""
        raise NotImplementedError

    def backlog(self, since: datetime, now: datetime) -> tuple[Backlog, LeftOut | None]:
        """The occurrences in ``(since, now]``, due and missed, and the earlier ones in
        that span that were left out (not looked at), if any."""
        raise NotImplementedError

    def now(self) -> datetime:
        return get_clock().now()

    def is_due(self, last_run_at: datetime | None) -> schedstate:
        now = self.now()
        if self.retry_at is not None and now < self.retry_at:
            return schedstate(False, (self.retry_at - now).total_seconds())
        floor = max(
            [now - self.catch_up, *(t for t in (self.handled_through, self.floor) if t is not None)]
        )
        pending = next(self.occurrences(floor + _TICK, now + _TICK), None)
        upcoming = next(self.occurrences(now + _TICK, now + _HORIZON), None)
        wait = (upcoming.at - now).total_seconds() if upcoming is not None else 3600.0
        if pending is not None:
            # look again soon: if publishing fails (the database is away), the occurrence
            # is retried within its window, not at the next occurrence
            wait = min(wait, RETRY_PENDING.total_seconds())
        return schedstate(pending is not None, max(wait, 0.0))

    def remaining_estimate(self, last_run_at: datetime | None) -> timedelta:
        now = self.now()
        upcoming = next(self.occurrences(now + _TICK, now + _HORIZON), None)
        return (upcoming.at - now) if upcoming is not None else timedelta(hours=1)


def _catch_up_of(value: timedelta | float, window: timedelta, kind: str) -> timedelta:
    catch_up = parse_duration(value, name=f"{kind} catch_up")
    if catch_up < window:
        raise ValueError(
            "catch_up must be at least the schedule's window, or an occurrence still "
            "within its window could be forgotten after a restart"
        )
    return catch_up


class ZonedSchedule(OccurrenceSchedule):
    """A beat schedule from a :class:`LocalSchedule` (one local time on given days)."""

    def __init__(
        self, local: LocalSchedule, catch_up: timedelta | float = timedelta(days=7), **kw: Any
    ) -> None:
        super().__init__(**kw)
        if not local.name:
            raise ValueError(
                "a ZonedSchedule's LocalSchedule needs a name: it prefixes each occurrence's "
                "run id, and the ledger finds the schedule's history by it"
            )
        self.local = local
        self.name = local.name
        self.window = local.window
        self.catch_up = _catch_up_of(catch_up, local.window, "ZonedSchedule")

    def occurrences(self, start: datetime, end: datetime) -> Iterator[Occurrence]:
        return occurrences(self.local, start, end)

    def backlog(self, since: datetime, now: datetime) -> tuple[Backlog, LeftOut | None]:
        return classify(self.local, since, now), None

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__class__, (self.local, self.catch_up)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ZonedSchedule):
            return (self.local, self.catch_up) == (other.local, other.catch_up)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.local, self.catch_up))

    def __repr__(self) -> str:
        local = self.local
        days = ",".join(str(day) for day in sorted(local.days))
        return f"<ZonedSchedule {local.name or ''} {local.at} {local.zone} days {days}>"


class PeriodicSchedule(OccurrenceSchedule):
    """A beat schedule from a :class:`~celery_deadlines.rules.periodic.Periodic`: every
    N on a fixed grid, a crontab in a zone, or once (what a django-celery-beat row
    holds: see :mod:`celery_deadlines.contrib.django_celery_beat`). One pass looks at the latest
    ``limit`` occurrences at most."""

    def __init__(
        self,
        periodic: Periodic,
        catch_up: timedelta | float = timedelta(days=7),
        limit: int = OCCURRENCE_LIMIT,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.periodic = periodic
        self.name = periodic.name
        self.window = periodic.window
        self.catch_up = _catch_up_of(catch_up, periodic.window, "PeriodicSchedule")
        self.limit = limit

    def occurrences(self, start: datetime, end: datetime) -> Iterator[Occurrence]:
        return periodic_occurrences(self.periodic, start, end)

    def backlog(self, since: datetime, now: datetime) -> tuple[Backlog, LeftOut | None]:
        return periodic_classify(self.periodic, since, now, self.limit)

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__class__, (self.periodic, self.catch_up, self.limit)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PeriodicSchedule):
            return self._key() == other._key()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[Periodic, timedelta, int]:
        return self.periodic, self.catch_up, self.limit

    def __repr__(self) -> str:
        return f"<PeriodicSchedule {self.name} {self.periodic.rule} window {self.window}>"


def occurrence_header(occurrence: Occurrence) -> dict[str, str]:
    """What a scheduled run carries on the wire (and the ledger stores)."""
    return {
        "schedule": occurrence.schedule,
        "zone": occurrence.zone,
        "local": occurrence.local.isoformat(),
        "at": occurrence.at.isoformat(),
    }


class ZonedSchedulerMixin:
    """Publishes the entries whose schedule is an :class:`OccurrenceSchedule`
    (:class:`ZonedSchedule`, :class:`PeriodicSchedule`) by occurrence, reconciled by run
    id; every other entry is the scheduler's own. For a scheduler that keeps
    ``beat_schedule`` in beat's memory or state file (Celery's); django-celery-beat's
    writes it to its table, which holds none of these: use
    :class:`celery_deadlines.contrib.django_celery_beat.DatabaseDeadlineScheduler` there."""

    app: Any
    _tasks_since_sync: int

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        if not isinstance(entry.schedule, OccurrenceSchedule):
            return super().apply_async(entry, producer, advance, **kwargs)  # type: ignore[misc]
        from django.db import close_old_connections

        entry = self.reserve(entry) if advance else entry  # type: ignore[attr-defined]
        close_old_connections()  # beat has no request cycle: drop a connection that broke
        schedule: OccurrenceSchedule = entry.schedule
        try:
            return catch_up(self.app, entry, producer)
        except Exception as exc:  # beat logs it; the entry is due again in RETRY_PENDING
            schedule.retry_at = schedule.now() + RETRY_PENDING
            raise SchedulingError(f"Couldn't apply scheduled task {entry.name}: {exc}") from exc
        finally:
            # as Celery's own apply_async: beat's state (its file, django-celery-beat's
            # rows) is written every beat_sync_every publishes or sync_every seconds
            self._tasks_since_sync += 1
            if self.should_sync():  # type: ignore[attr-defined]
                self._do_sync()  # type: ignore[attr-defined]


def catch_up(app: Any, entry: Any, producer: Any = None) -> list[str]:
    """Publish the occurrences of ``entry`` still in their window that have no run, and
    record the ones whose window closed as missed (all of them, for a schedule that
    was refused). Returns the run ids published."""
    from django.db import transaction

    from .ledger.api import store_for

    schedule: OccurrenceSchedule = entry.schedule
    store = store_for(app)
    if not _clock_agrees(app, store, entry.name):
        schedule.retry_at = schedule.now() + RETRY_PENDING
        return []
    schedule.retry_at = None
    now = schedule.now()
    last = store.sweeps.last_occurrence(schedule.name)
    # a schedule the ledger has never seen starts now: nothing before it was "missed"
    # (a refused one has no window to look back over: it starts when beat first saw it)
    start = now - schedule.window
    if schedule.refused is not None:
        start = schedule.handled_through or now
    since = start if last is None else max(last, now - schedule.catch_up)
    if schedule.floor is not None and schedule.floor > since:
        since = schedule.floor
    backlog, left_out = schedule.backlog(since, now)
    if left_out is not None:
        logger.warning(
            "%s: the occurrences from %s to %s are older than the latest %d looked at: "
            "they are neither published nor recorded missed",
            entry.name,
            left_out.first.at.isoformat(),
            left_out.last.at.isoformat(),
            len(backlog.due) + len(backlog.missed),
        )
    known = store.sweeps.known([o.run_id for o in (*backlog.due, *backlog.missed)])
    if schedule.refused is not None:
        for refused in (*backlog.missed, *backlog.due):
            if refused.run_id not in known:
                why = f"was not published: {schedule.refused}"
                _record_missed(app, store, entry, refused, why, deadline=refused.at)
        schedule.handled_through = now
        return []
    for missed in backlog.missed:
        if missed.run_id in known:
            continue
        why = (
            f"was not published before its window closed at {missed.deadline.isoformat()}; "
            "recorded as missed, not run late"
        )
        _record_missed(app, store, entry, missed, why, deadline=missed.deadline)
    published = []
    task = app.tasks[entry.task]
    if not is_deadline_task(task):
        raise ConfigurationError(
            f"beat entry {entry.name!r}: a {type(schedule).__name__} needs a DeadlineTask, and "
            f"{entry.task} is not one (base=DeadlineTask)"
        )
    for due in backlog.due:
        if due.run_id in known:
            continue
        options = dict(entry.options)
        headers, left = entry_headers(options.pop("headers", None) or {})
        if left:
            logger.warning(
                "%s: header(s) %s of the entry are not sent: the occurrence's run id, "
                "task and window are its message's",
                entry.name,
                ", ".join(shown(name) for name in left),
            )
        headers["celery_beat_task"] = True
        headers[wire.OCCURRENCE_HEADER] = occurrence_header(due)
        # in a transaction, the outbox publishes on commit: if the broker is down the run
        # stays QUEUED and the sweeper publishes it again; the occurrence is not lost
        with transaction.atomic(using=store.using):
            try:
                task.apply_async(
                    entry.args,
                    entry.kwargs,
                    task_id=due.run_id,
                    producer=producer,
                    deadline=due.deadline,
                    headers=headers,
                    **options,
                )
            except DeadlineRefused:  # too little of its window left: recorded EXPIRED
                continue
        published.append(due.run_id)
        logger.info(
            "%s: published occurrence %s (window %s to %s)",
            entry.name,
            due.run_id,
            due.at.isoformat(),
            due.deadline.isoformat(),
        )
    schedule.handled_through = now
    logger.info(
        "%s: occurrences reconciled through %s: %d published, %d already recorded",
        entry.name,
        now.isoformat(),
        len(published),
        len(known),
    )
    return published


def _record_missed(
    app: Any, store: Any, entry: Any, occurrence: Occurrence, why: str, *, deadline: datetime
) -> None:
    """Record ``occurrence`` of ``entry`` EXPIRED / ``missed_occurrence`` (never run),
    saying ``why``, with ``deadline`` as its run's."""
    from .ledger import operations
    from .ledger.api import NewRun

    header = occurrence_header(occurrence)
    run = NewRun(
        task_id=occurrence.run_id,
        task_name=entry.task,
        deadline=deadline,
        delivery_deadline=None,
        root_id=occurrence.run_id,
        parent_id="",
        retries=0,
        available_at=None,
        message_body=None,
        content_type="",
        content_encoding="",
        not_before=occurrence.at,
        schedule=occurrence.schedule,
        schedule_zone=occurrence.zone,
        schedule_local=header["local"],
    )
    detail = (
        f"{entry.name}: occurrence {header['local']} {occurrence.zone} "
        f"({occurrence.at.isoformat()}) {why}"
    )
    operations.record_missed(app, store, run, detail)


def _clock_agrees(app: Any, store: Any, name: str) -> bool:
    """With ``deadlines_clock_skew_budget`` set, beat publishes only while its clock
    agrees with the ledger's (the clock-skew gate: CLOCK_UNCERTAIN comes before NOT_READY
    and EXPIRED); without it, beat's clock is trusted, as a worker's is."""
    from .ledger.api import describe, measure

    budget = settings_for(app).get(conf.CLOCK_SKEW_BUDGET)
    if budget is None:
        return True
    reading, _ = measure(store)
    if skew.gate(get_clock().now(), reading, budget) is not skew.Readiness.CLOCK_UNCERTAIN:
        return True
    logger.warning(
        "%s: clock uncertain (%s, beyond the skew budget of %s s): nothing is published "
        "or recorded missed until beat's clock agrees with the ledger's",
        name,
        describe(reading),
        budget.total_seconds(),
    )
    clock_uncertain.send(sender=app, reading=reading, budget=budget)
    return False


class DeadlineScheduler(ZonedSchedulerMixin, PersistentScheduler):
    """Celery's default scheduler, with :class:`ZonedSchedule` entries reconciled by
    run id against the ledger (``beat_scheduler = "celery_deadlines.beat:DeadlineScheduler"``)."""


__all__ = [
    "OCCURRENCE_LIMIT",
    "WEEKDAYS",
    "DeadlineScheduler",
    "LocalSchedule",
    "OccurrenceSchedule",
    "Periodic",
    "PeriodicSchedule",
    "ZonedSchedule",
    "ZonedSchedulerMixin",
    "catch_up",
    "entry_headers",
    "occurrence_header",
]
