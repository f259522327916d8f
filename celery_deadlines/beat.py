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
from datetime import datetime, timedelta
from typing import Any

from celery.beat import PersistentScheduler, SchedulingError
from celery.schedules import BaseSchedule, schedstate

from . import conf
from .clock import get_clock
from .conf import settings_for
from .errors import ConfigurationError, DeadlineRefused
from .rules import skew
from .rules.budgets import parse_duration
from .rules.schedules import WEEKDAYS, LocalSchedule, Occurrence, classify, occurrences
from .rules.wire import OCCURRENCE_HEADER
from .signals import clock_uncertain

logger = logging.getLogger("celery_deadlines")

#: Far enough ahead to find the next occurrence of any weekly schedule.
_HORIZON = timedelta(days=8)
_TICK = timedelta(microseconds=1)
#: How soon an entry with an unhandled occurrence is looked at again.
RETRY_PENDING = timedelta(seconds=5)


class ZonedSchedule(BaseSchedule):
    """A beat schedule from a :class:`LocalSchedule`, read on the library's clock.

    ``is_due`` has no side effects (beat calls it to order its heap too): an entry is
    due while an occurrence in ``(handled_through, now]`` exists, where
    ``handled_through`` is what the scheduler last reconciled, at most ``catch_up`` ago.
    """

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
        self.catch_up = parse_duration(catch_up, name="ZonedSchedule catch_up")
        if self.catch_up < local.window:
            raise ValueError(
                "catch_up must be at least the schedule's window, or an occurrence still "
                "within its window could be forgotten after a restart"
            )
        #: the instant through which every occurrence is published or recorded missed
        self.handled_through: datetime | None = None
        #: after a failed attempt (database away, clock in doubt): not due again before
        #: this, so beat waits instead of trying on every tick
        self.retry_at: datetime | None = None

    def now(self) -> datetime:
        return get_clock().now()

    def is_due(self, last_run_at: datetime | None) -> schedstate:
        now = self.now()
        if self.retry_at is not None and now < self.retry_at:
            return schedstate(False, (self.retry_at - now).total_seconds())
        floor = now - self.catch_up
        if self.handled_through is not None and self.handled_through > floor:
            floor = self.handled_through
        pending = next(occurrences(self.local, floor + _TICK, now + _TICK), None)
        upcoming = next(occurrences(self.local, now + _TICK, now + _HORIZON), None)
        wait = (upcoming.at - now).total_seconds() if upcoming is not None else 3600.0
        if pending is not None:
            # look again soon: if publishing fails (the database is away), the occurrence
            # is retried within its window, not at the next occurrence
            wait = min(wait, RETRY_PENDING.total_seconds())
        return schedstate(pending is not None, max(wait, 0.0))

    def remaining_estimate(self, last_run_at: datetime | None) -> timedelta:
        now = self.now()
        upcoming = next(occurrences(self.local, now + _TICK, now + _HORIZON), None)
        return (upcoming.at - now) if upcoming is not None else timedelta(hours=1)

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


def occurrence_header(occurrence: Occurrence) -> dict[str, str]:
    """What a scheduled run carries on the wire (and the ledger stores)."""
    return {
        "schedule": occurrence.schedule,
        "zone": occurrence.zone,
        "local": occurrence.local.isoformat(),
        "at": occurrence.at.isoformat(),
    }


class ZonedSchedulerMixin:
    """Publishes :class:`ZonedSchedule` entries by occurrence, reconciled by run id."""

    app: Any

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        if not isinstance(entry.schedule, ZonedSchedule):
            return super().apply_async(entry, producer, advance, **kwargs)  # type: ignore[misc]
        from django.db import close_old_connections

        entry = self.reserve(entry) if advance else entry  # type: ignore[attr-defined]
        close_old_connections()  # beat has no request cycle: drop a connection that broke
        zoned: ZonedSchedule = entry.schedule
        try:
            return catch_up(self.app, entry, producer)
        except Exception as exc:  # beat logs it; the entry is due again in RETRY_PENDING
            zoned.retry_at = zoned.now() + RETRY_PENDING
            raise SchedulingError(f"Couldn't apply scheduled task {entry.name}: {exc}") from exc


def catch_up(app: Any, entry: Any, producer: Any = None) -> list[str]:
    """Publish the occurrences of ``entry`` still in their window that have no run, and
    record the ones whose window closed as missed. Returns the run ids published."""
    from django.db import transaction

    from .ledger import operations
    from .ledger.api import NewRun, store_for
    from .task import DeadlineTask

    zoned: ZonedSchedule = entry.schedule
    store = store_for(app)
    if not _clock_agrees(app, store, entry.name):
        zoned.retry_at = zoned.now() + RETRY_PENDING
        return []
    zoned.retry_at = None
    now = zoned.now()
    last = store.sweeps.last_occurrence(zoned.local.name)
    # a schedule the ledger has never seen starts now: nothing before it was "missed"
    since = now - zoned.local.window if last is None else max(last, now - zoned.catch_up)
    backlog = classify(zoned.local, since, now)
    known = store.sweeps.known([o.run_id for o in (*backlog.due, *backlog.missed)])
    for missed in backlog.missed:
        if missed.run_id in known:
            continue
        header = occurrence_header(missed)
        run = NewRun(
            task_id=missed.run_id,
            task_name=entry.task,
            deadline=missed.deadline,
            delivery_deadline=None,
            root_id=missed.run_id,
            parent_id="",
            retries=0,
            available_at=None,
            message_body=None,
            content_type="",
            content_encoding="",
            not_before=missed.at,
            schedule=missed.schedule,
            schedule_zone=missed.zone,
            schedule_local=header["local"],
        )
        detail = (
            f"{entry.name}: occurrence {header['local']} {missed.zone} "
            f"({missed.at.isoformat()}) was not published before its window closed at "
            f"{missed.deadline.isoformat()}; recorded as missed, not run late"
        )
        operations.record_missed(app, store, run, detail)
    published = []
    task = app.tasks[entry.task]
    if not isinstance(task, DeadlineTask):
        raise ConfigurationError(
            f"beat entry {entry.name!r}: a ZonedSchedule needs a DeadlineTask, and "
            f"{entry.task} is not one (base=DeadlineTask)"
        )
    for due in backlog.due:
        if due.run_id in known:
            continue
        options = dict(entry.options)
        headers = dict(options.pop("headers", None) or {})
        headers["celery_beat_task"] = True
        headers[OCCURRENCE_HEADER] = occurrence_header(due)
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
    zoned.handled_through = now
    logger.info(
        "%s: occurrences reconciled through %s: %d published, %d already recorded",
        entry.name,
        now.isoformat(),
        len(published),
        len(known),
    )
    return published


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
    "DeadlineScheduler",
    "ZonedSchedule",
    "ZonedSchedulerMixin",
    "catch_up",
    "occurrence_header",
]


__all__ = [
    "WEEKDAYS",
    "DeadlineScheduler",
    "LocalSchedule",
    "ZonedSchedule",
    "ZonedSchedulerMixin",
]
