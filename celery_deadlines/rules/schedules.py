"""Schedules in a time zone, resolved to UTC occurrences before any run exists
(docs/explanation/time-contracts.md).

"Every weekday at 09:00 Europe/Berlin" is a rule about local wall-clock time. Before a
run is created, each occurrence is resolved to one aware UTC instant and stored with
the zone and local time it came from, and with its window: it may start at
``not_before`` (the instant) and must be done by ``deadline`` (the instant plus the
window). Nothing downstream reinterprets local time.

Daylight-saving transitions, one documented policy:

* **A local time that does not exist** (the clock jumps from 02:00 to 03:00) is
  resolved with the offset in force *before* the jump, so 02:30 runs at the instant
  the wall clock reads 03:30. It is shifted, never skipped.
* **A local time that happens twice** (the clock falls back from 03:00 to 02:00) runs
  once, at its *first* occurrence (``fold=0``), never twice and never not at all.

After an outage, :func:`classify` splits the occurrences since the last check into
those still within their window (due: run them now, with the deadline they always had)
and those whose window passed (missed: record them, do not run them late).

Pure: no clock reads, no Celery. Instants in and out are aware UTC datetimes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..errors import InvalidDeadline
from .budgets import parse_duration, parse_instant

#: ISO weekday numbers (Monday is 1).
WEEKDAYS = frozenset({1, 2, 3, 4, 5})
EVERY_DAY = frozenset({1, 2, 3, 4, 5, 6, 7})


@dataclass(frozen=True, slots=True)
class LocalSchedule:
    """Run at ``at`` local time in ``zone`` on ``days`` (ISO weekdays), each occurrence
    with ``window`` to be done in."""

    at: time
    zone: str
    window: timedelta
    days: frozenset[int] = EVERY_DAY
    #: names the schedule in each occurrence's run id (two schedules at the same local
    #: time in the same zone must not share ids)
    name: str = ""

    def __post_init__(self) -> None:
        if self.at.tzinfo is not None:
            raise InvalidDeadline(f"schedule time {self.at} must be a local wall time, no zone")
        try:
            ZoneInfo(self.zone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise InvalidDeadline(f"unknown time zone {self.zone!r}") from exc
        # seconds are accepted too; stored as a timedelta (frozen: set it directly)
        object.__setattr__(self, "window", parse_duration(self.window, name="schedule window"))
        if not self.days or not self.days <= EVERY_DAY:
            raise InvalidDeadline(f"schedule days must be ISO weekdays 1-7, got {set(self.days)}")


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One resolved occurrence: when (UTC), from which local time, and its window."""

    at: datetime  # aware UTC; also not_before
    local: datetime  # the local wall time it came from (naive), in ``zone``
    zone: str
    deadline: datetime  # aware UTC
    #: how the local time was resolved: "exact", "gap" (shifted) or "fold" (first of two)
    resolution: str
    schedule: str = ""

    @property
    def not_before(self) -> datetime:
        return self.at

    @property
    def run_id(self) -> str:
        """A stable id for the run of this occurrence (reconcile by id after restarts)."""
        prefix = f"{self.schedule}:" if self.schedule else ""
        return f"{prefix}{self.zone}@{self.local.isoformat()}"


def resolve(local: datetime, zone: str) -> tuple[datetime, str]:
    """The UTC instant of a naive local wall time in ``zone``, by the policy above, and
    how it was resolved: ``exact``, ``gap`` (did not exist: shifted) or ``fold``
    (happened twice: the first)."""
    if local.tzinfo is not None:
        raise InvalidDeadline(f"{local.isoformat()} must be a naive local wall time")
    info = ZoneInfo(zone)
    first = local.replace(tzinfo=info, fold=0)  # PEP 495: the offset before a transition
    instant = first.astimezone(UTC)
    if first.utcoffset() == local.replace(tzinfo=info, fold=1).utcoffset():
        return instant, "exact"
    # two offsets: the wall time was either skipped or repeated by a transition
    back = instant.astimezone(info).replace(tzinfo=None)
    return instant, ("fold" if back == local else "gap")


def occurrences(schedule: LocalSchedule, start: datetime, end: datetime) -> Iterator[Occurrence]:
    """Every occurrence with ``start <= at < end`` (aware instants), in order."""
    start = parse_instant(start, name="start").astimezone(UTC)
    end = parse_instant(end, name="end").astimezone(UTC)
    info = ZoneInfo(schedule.zone)
    # local dates that can hold an instant in [start, end): pad a day each side
    day: date = start.astimezone(info).date() - timedelta(days=1)
    last: date = end.astimezone(info).date() + timedelta(days=1)
    previous: datetime | None = None
    while day <= last:
        if day.isoweekday() in schedule.days:
            local = datetime.combine(day, schedule.at)
            instant, how = resolve(local, schedule.zone)
            # a zone that skips a whole day (Pacific/Apia, 2011) maps two local dates to
            # one instant: it runs once
            if start <= instant < end and instant != previous:
                yield Occurrence(
                    at=instant,
                    local=local,
                    zone=schedule.zone,
                    deadline=instant + schedule.window,
                    resolution=how,
                    schedule=schedule.name,
                )
            previous = instant
        day += timedelta(days=1)


@dataclass(frozen=True, slots=True)
class Backlog:
    """Occurrences since the last check: run ``due`` now, record ``missed``."""

    due: tuple[Occurrence, ...]
    missed: tuple[Occurrence, ...]


def classify(schedule: LocalSchedule, since: datetime, now: datetime) -> Backlog:
    """Split the occurrences in ``(since, now]`` by whether their window is still open.

    Half-open on the left: consecutive checks (``since`` = the previous ``now``, reloaded
    from durable state after a restart) see every occurrence exactly once, one that
    falls on the boundary included.
    """
    tick = timedelta(microseconds=1)
    found = list(occurrences(schedule, since + tick, now + tick))
    due = tuple(occurrence for occurrence in found if now < occurrence.deadline)
    missed = tuple(occurrence for occurrence in found if now >= occurrence.deadline)
    return Backlog(due, missed)
