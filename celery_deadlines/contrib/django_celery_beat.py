"""django-celery-beat's ``DatabaseScheduler``, with deadlines, occurrences and missed
windows for the ``PeriodicTask`` rows of DeadlineTasks, and :class:`~.beat.ZonedSchedule`
entries beside them::

    celery -A proj beat -S celery_deadlines.contrib.django_celery_beat:DatabaseDeadlineScheduler

The only module of the package that imports django-celery-beat (an optional
dependency: nothing else imports this one). It needs the Django app (the ledger) and
``django_celery_beat`` in the beat process, as django-celery-beat does.

**beat_schedule entries whose schedule is a** :class:`~.beat.ZonedSchedule` (or a
:class:`~.beat.PeriodicSchedule`) stay in beat's memory, beside the rows; they are not
written to the ``PeriodicTask`` table, which cannot hold them. The ledger is their
durable state, as with :class:`~.beat.DeadlineScheduler`.

**A row whose task is a DeadlineTask** is published by occurrence (:func:`.beat.catch_up`):

* its occurrences are the instants its schedule names: an interval's on the grid
  ``start_time + k * every`` (the Unix epoch when the row has no start time), a
  crontab's in the crontab's time zone (the library's one DST policy), a clocked
  schedule's one instant; none before the row's ``start_time``;
* each occurrence is the run ``<row name>:<zone>@<local wall time>``, published with
  the deadline ``instant + window``; the window is the row's ``expire_seconds``, else
  the task's budget (the duration a call with no options would get);
* an occurrence with no run still within its window is published (late, after beat was
  down, with the deadline it always had); one whose window closed is recorded
  ``EXPIRED`` / ``missed_occurrence``, never run late; a restart, a lost ``last_run_at``
  or a second beat neither loses nor doubles one: the ledger holds each run id once.

A window longer than ``deadlines_max_budget`` is refused when the row is read (logged
once): none of the row's occurrences is published, each is recorded ``EXPIRED`` /
``missed_occurrence`` saying why, until the row is changed.

The row's other fields keep their django-celery-beat meaning: ``enabled``,
``start_time``, ``expires`` (no occurrence after it), ``one_off``, ``queue``,
``exchange``, ``routing_key``, ``priority``, ``headers``, ``args``, ``kwargs``.
``last_run_at`` and ``total_run_count`` are kept as django-celery-beat keeps them, for
the admin; the ledger, not they, says what ran.

A row of a plain task, a solar schedule, or a DeadlineTask with neither
``expire_seconds`` nor a budget is published as django-celery-beat publishes it (the
last two logged once, saying why).

Whatever its task, a row's ``headers`` never set a field of its message nor a deadline
(:func:`~.beat.entry_headers`: not sent, logged once per row), and a row whose
``headers`` are not a JSON object is not scheduled (an ERROR each time the table is
read), where django-celery-beat's reading of the table stopped at it.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from celery import schedules as celery_schedules
from celery.beat import ScheduleEntry

# django-celery-beat has no type information: its names are Any here
from django_celery_beat.clockedschedule import clocked  # type: ignore[import-untyped]
from django_celery_beat.schedulers import (  # type: ignore[import-untyped]
    DatabaseScheduler,
    ModelEntry,
)
from kombu.utils.json import loads

from ..beat import OccurrenceSchedule, PeriodicSchedule, ZonedSchedulerMixin, entry_headers
from ..clock import get_clock
from ..conf import settings_for
from ..core import options
from ..rules.contracts import is_deadline_task
from ..rules.periodic import EPOCH, Cron, Every, Once, Periodic, Rule
from ..rules.quoting import shown

logger = logging.getLogger("celery_deadlines")

#: Longest row name whose run ids fit the ledger's task id (255 characters, less the
#: zone and the local wall time that follow the name).
LONGEST_NAME = 180

#: A change stamp that could not be read (equal to no stamp but itself).
_UNREAD = object()


class DeadlineModelEntry(ModelEntry):  # type: ignore[misc]
    """django-celery-beat's entry for a row, on the library's clock, keeping its
    occurrence schedule (and what it reconciled) from one run to the next."""

    def __init__(self, model: Any, app: Any = None) -> None:
        #: no beat has run the row since it was saved without one (created, or enabled
        #: again: django-celery-beat clears last_run_at when a row is disabled)
        self.never_run = model.last_run_at is None
        try:
            headers = loads(model.headers or "{}")  # as django-celery-beat reads them
        except Exception:  # noqa: BLE001 - kombu's types raise TypeError, ValueError, ...
            headers = None
        if not isinstance(headers, dict):
            # django-celery-beat leaves out a row whose headers are not JSON (its
            # ValueError), and stopped at one whose JSON is not an object (a TypeError
            # out of reading the table: beat published no row at all)
            logger.error(
                "periodic task %s is not scheduled: its headers are not a JSON object: %s",
                shown(model.name),
                shown(model.headers),
            )
            raise ValueError(f"periodic task {shown(model.name)}: headers not a JSON object")
        super().__init__(model, app=app)
        #: the names of the row's headers that are not sent (beat.entry_headers)
        self.headers_left_out: list[str]
        self.options["headers"], self.headers_left_out = entry_headers(self.options["headers"])

    def _default_now(self) -> datetime:
        from django.conf import settings

        now = get_clock().now()
        if getattr(settings, "DJANGO_CELERY_BEAT_TZ_AWARE", True):
            return now.astimezone(self.app.timezone)
        return now.astimezone(UTC).replace(tzinfo=None)  # naive UTC, as django-celery-beat's

    def __next__(self) -> DeadlineModelEntry:
        following: DeadlineModelEntry = super().__next__()
        following.app = self.app  # django-celery-beat's __next__ takes Celery's current app
        following.schedule = self.schedule
        return following


class DatabaseDeadlineScheduler(ZonedSchedulerMixin, DatabaseScheduler):  # type: ignore[misc]
    """django-celery-beat's scheduler; the rows of DeadlineTasks and the
    ``ZonedSchedule`` entries are published by occurrence (see the module)."""

    Entry = DeadlineModelEntry
    _last_timestamp: Any  # django-celery-beat's: the table's change stamp, as last read
    #: how far back a restarted beat looks for a row's occurrences (at least the window)
    catch_up = timedelta(days=7)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # set before DatabaseScheduler's __init__, which reads the schedule
        #: beat_schedule entries with an occurrence schedule, kept out of the table
        self.zoned: dict[str, ScheduleEntry] = {}
        #: each row's occurrence schedule by row name: what it reconciled survives the
        #: table being read again (on every change, and every five minutes)
        self.periodic: dict[str, PeriodicSchedule] = {}
        self._told: set[tuple[str, str]] = set()
        #: the table's change stamp has been read with the rows at least once
        self._stamped = False
        #: writing rows of its own (update_from_dict): none of them is a change
        self._writing = False
        super().__init__(*args, **kwargs)

    def schedule_changed(self) -> bool:
        if self._writing:
            return False  # its own rows, in its schedule already
        # django-celery-beat reads its first change stamp as no change (``ts > (last or
        # ts)``), so a row saved between its initial read and its first look waited for
        # the five-minute full sync: the stamp read with the rows (below) is ``last``
        before = self._last_timestamp
        changed = bool(super().schedule_changed())
        return changed or (self._stamped and before is None and self._last_timestamp is not None)

    def update_from_dict(self, mapping: dict[str, Any]) -> None:
        kept = {
            name: fields
            for name, fields in mapping.items()
            if isinstance(fields.get("schedule"), OccurrenceSchedule)
        }
        # the rows it writes from its own configuration (celery.backend_cleanup, the
        # beat_schedule entries) are not changes to sync and read the table again for:
        # the stamp they move is taken as read, unless another writer moved it first or
        # saved a row meanwhile (an operator's row saved as beat starts)
        own = [name for name in mapping if name not in kept]
        since = get_clock().now()
        read = self._last_timestamp
        before = self._change_stamp() if self._stamped else None
        self._writing = True
        try:
            super().update_from_dict({name: mapping[name] for name in own})
        finally:
            self._writing = False
        after = self._change_stamp() if self._stamped and before == read else _UNREAD
        if after is not _UNREAD and not self._saved_by_another(since, own):
            self._last_timestamp = after
        schedule = self.schedule
        for entry in schedule.values():
            self.adopt(entry)
        for name, fields in kept.items():
            entry = self.zoned[name] = ScheduleEntry(**dict(fields, name=name, app=self.app))
            schedule[name] = entry

    def _saved_by_another(self, since: datetime, own: list[str]) -> bool:
        """Whether a row not among ``own`` was saved at ``since`` or later (``True`` when
        the table cannot be read: the next look then reads it again)."""
        try:
            others = self.Model.objects.filter(date_changed__gte=since).exclude(name__in=own)
            return bool(others.exists())
        except Exception:  # noqa: BLE001 - django-celery-beat's own look reads it again
            return True

    def _change_stamp(self) -> Any:
        """The table's change stamp now (``_UNREAD`` when it cannot be read: no write of
        its own is then taken as read)."""
        try:
            return self.Changes.last_change()
        except Exception:  # noqa: BLE001 - django-celery-beat's own look reads it again
            return _UNREAD

    def all_as_schedule(self) -> dict[str, Any]:
        if not self._stamped:
            # read before the rows: a change after this is seen by the next look
            self._stamped = True
            try:
                self._last_timestamp = self.Changes.last_change()
            except Exception:  # django-celery-beat's own look reads it again
                logger.warning("reading django-celery-beat's change stamp failed", exc_info=True)
        entries: dict[str, Any] = super().all_as_schedule()
        for entry in entries.values():
            self.adopt(entry)
        for name in sorted(entries.keys() & self.zoned.keys()):
            if (name, "shadowed") not in self._told:
                self._told.add((name, "shadowed"))
                logger.warning(
                    "periodic task %r: the beat_schedule entry of that name runs instead", name
                )
        entries.update(self.zoned)
        return entries

    def reserve(self, entry: Any) -> Any:
        if entry.name in self.zoned and not isinstance(entry, ModelEntry):
            # beat's memory is this entry's only home: no row to mark for sync
            following = self.zoned[entry.name] = next(entry)
            self.schedule[entry.name] = following
            return following
        return super().reserve(entry)

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        counted = isinstance(entry, ModelEntry) and isinstance(entry.schedule, PeriodicSchedule)
        try:
            published = super().apply_async(entry, producer, advance, **kwargs)
        except Exception:
            if counted:
                entry.model.total_run_count -= 1  # nothing was published
            raise
        if counted:
            # the row counts the runs it published (the admin's "total run count", and
            # what one_off reads), not beat's passes: reserve() counted this pass as one
            entry.model.total_run_count += len(published) - 1
        return published

    def adopt(self, entry: Any) -> None:
        """Give a row's entry its occurrence schedule, if its task is a DeadlineTask
        and the row names a window (kept across reads while the row is unchanged)."""
        if not isinstance(entry, ModelEntry) or isinstance(entry.schedule, OccurrenceSchedule):
            return
        left_out = getattr(entry, "headers_left_out", None)
        if left_out:
            self.tell(
                entry.name,
                f"headers {left_out}",
                f"its header(s) {', '.join(shown(name) for name in left_out)} are not sent: "
                "the message's id, task and deadline are beat's and the row's to say",
                published="",
            )
        periodic = self.periodic_of(entry)
        if periodic is None:
            self.periodic.pop(entry.name, None)
            return
        refused = self.refusal_of(entry, periodic)
        kept = self.periodic.get(entry.name)
        if kept is None or kept.periodic != periodic or kept.refused != refused:
            catch_up = max(self.catch_up, periodic.window)
            edited = kept is not None  # its schedule, window or task changed as beat ran
            kept = self.periodic[entry.name] = PeriodicSchedule(periodic, catch_up=catch_up)
            kept.refused = refused
            if edited or getattr(entry, "never_run", False):
                # the row's occurrences start when it was saved: none from before it
                # existed, was enabled again or said this
                kept.floor = _aware(entry.model.date_changed)
        entry.schedule = kept

    def refusal_of(self, entry: ModelEntry, periodic: Periodic) -> str | None:
        """Why none of the row's occurrences may be published (logged once), or
        ``None``: a window longer than ``deadlines_max_budget``, which no deadline may be."""
        longest = settings_for(self.app).budget_bound()
        if periodic.window <= longest:
            return None
        refusal = (
            f"its window of {periodic.window.total_seconds():.0f} s (expire_seconds) is "
            f"longer than deadlines_max_budget ({longest.total_seconds():.0f} s)"
        )
        self.tell(
            entry.name,
            refusal,
            f"{refusal}, so none of its occurrences is published: each is recorded "
            "EXPIRED / missed_occurrence, saying this, until the row is changed",
            published="",
        )
        return refusal

    def periodic_of(self, entry: ModelEntry) -> Periodic | None:
        """The occurrences of a DeadlineTask's row; ``None`` for a row published as
        django-celery-beat publishes it."""
        task = self.app.tasks.get(entry.task)
        if task is None or not is_deadline_task(task):
            return None
        model = entry.model
        window: timedelta | None
        if model.expire_seconds:
            window = timedelta(seconds=model.expire_seconds)
        else:
            window = options.times(task, settings_for(self.app)).resolve("budget")[1]
        if window is None:
            self.tell(
                entry.name,
                "window",
                "it has no expire_seconds and its task no budget, so its occurrences "
                "have no window",
            )
            return None
        if len(entry.name) > LONGEST_NAME:
            self.tell(entry.name, "name", f"its name is longer than {LONGEST_NAME} characters")
            return None
        rule = self.rule_of(entry.schedule, model.start_time)
        if rule is None:
            self.tell(entry.name, "rule", f"its schedule {entry.schedule!r} has no occurrences")
            return None
        return Periodic(rule, window, entry.name, not_before=_aware(model.start_time))

    def rule_of(self, schedule: Any, start_time: datetime | None) -> Rule | None:
        """The occurrences of a Celery schedule from a row, or ``None`` (solar)."""
        # read as Any: Celery's stubs name neither a crontab's sets nor run_every
        given: Any = schedule
        if isinstance(schedule, celery_schedules.crontab):
            zone = _zone_name(getattr(given, "tz", None) or self.app.timezone)
            if zone is None:
                return None
            return Cron(
                frozenset(given.minute),
                frozenset(given.hour),
                frozenset(given.day_of_week),
                frozenset(given.day_of_month),
                frozenset(given.month_of_year),
                zone,
            )
        if isinstance(schedule, clocked):
            return Once(_aware(given.clocked_time) or EPOCH)
        if isinstance(schedule, celery_schedules.schedule):
            return Every(given.run_every, _aware(start_time) or EPOCH)
        return None

    def tell(self, name: str, why: str, detail: str, published: str | None = None) -> None:
        """Log, once per row and reason, what is wrong with a row and what is done with
        it (by default: a DeadlineTask's row published as django-celery-beat publishes
        it)."""
        if published is None:
            published = (
                "; it is published as django-celery-beat publishes it, with no occurrence "
                "run id and no missed-window record"
            )
        if (name, why) not in self._told:
            self._told.add((name, why))
            logger.warning("periodic task %s: %s%s", shown(name), detail, published)


def _aware(instant: datetime | None) -> datetime | None:
    """A row's datetime, aware (a naive one is in Django's zone, as Django stores it)."""
    if instant is None or instant.tzinfo is not None:
        return instant
    from django.utils import timezone

    return timezone.make_aware(instant)


def _zone_name(tz: Any) -> str | None:
    if isinstance(tz, ZoneInfo):
        return tz.key
    if tz is UTC or tz == UTC:
        return "UTC"
    return None


__all__ = ["DatabaseDeadlineScheduler", "DeadlineModelEntry"]
