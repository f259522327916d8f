"""Periodic schedules other than one local time a day, as UTC occurrences with a window.

A :class:`Periodic` names a rule, the window each occurrence has to be done in and the
schedule's name (each occurrence's run id starts with it). The rules are the ones a
django-celery-beat row can hold:

* :class:`Every` — every ``every``, on the grid ``anchor + k * every`` (k ≥ 0). The
  grid, not "``every`` after the last run": every scheduler, before and after a restart,
  names the same instants, so an occurrence has one run id wherever it is published.
* :class:`Cron` — the minutes, hours, weekdays, days of the month and months of a
  crontab, as Celery reads them (the day fields both have to match), in a time zone.
  Each wall time is resolved by the one DST policy of :mod:`.schedules` (a time that does
  not exist is shifted, one that happens twice runs at its first); two wall times that
  resolve to one instant run once, as the one that exists.
* :class:`Once` — one instant (a clocked schedule).

:func:`classify` splits the occurrences since the last check into due and missed, as
:func:`.schedules.classify` does, and looks at no more than the latest ``limit`` of
them: an every-second schedule after a week without beat is not 600 000 records.

Pure: no clock reads, no Celery. Instants in and out are aware UTC datetimes.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..errors import InvalidDeadline
from .budgets import parse_duration, parse_instant
from .schedules import Backlog, LocalSchedule, Occurrence
from .schedules import occurrences as local_occurrences

#: Where an :class:`Every` grid starts when nothing else is said.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TICK = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Every:
    """Every ``every``, at ``anchor + k * every`` for k = 0, 1, 2, …"""

    every: timedelta
    anchor: datetime = EPOCH

    def __post_init__(self) -> None:
        object.__setattr__(self, "every", parse_duration(self.every, name="interval"))
        anchor = parse_instant(self.anchor, name="interval anchor").astimezone(UTC)
        object.__setattr__(self, "anchor", anchor)


@dataclass(frozen=True, slots=True)
class Cron:
    """A crontab's sets (Celery's: ``days_of_week`` 0 is Sunday) in ``zone``."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days_of_week: frozenset[int]
    days_of_month: frozenset[int]
    months: frozenset[int]
    zone: str = "UTC"

    def __post_init__(self) -> None:
        ranges = {
            "minutes": range(60),
            "hours": range(24),
            "days_of_week": range(7),
            "days_of_month": range(1, 32),
            "months": range(1, 13),
        }
        for field, allowed in ranges.items():
            values = frozenset(getattr(self, field))
            if not values or not all(value in allowed for value in values):
                raise InvalidDeadline(
                    f"crontab {field} must be a non-empty set within "
                    f"{allowed.start}-{allowed.stop - 1}, got {sorted(values)}"
                )
            object.__setattr__(self, field, values)
        try:
            ZoneInfo(self.zone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise InvalidDeadline(f"unknown time zone {self.zone!r}") from exc


@dataclass(frozen=True, slots=True)
class Once:
    """One instant."""

    at: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "at", parse_instant(self.at, name="instant").astimezone(UTC))


Rule = Every | Cron | Once


@dataclass(frozen=True, slots=True)
class Periodic:
    """``rule``'s occurrences, each with ``window`` to be done in, named ``name``; none
    before ``not_before`` (a row's start time)."""

    rule: Rule
    window: timedelta
    name: str
    not_before: datetime | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidDeadline("a periodic schedule needs a name: it prefixes its run ids")
        object.__setattr__(self, "window", parse_duration(self.window, name="schedule window"))
        if self.not_before is not None:
            start = parse_instant(self.not_before, name="schedule start").astimezone(UTC)
            object.__setattr__(self, "not_before", start)


def occurrences(periodic: Periodic, start: datetime, end: datetime) -> Iterator[Occurrence]:
    """Every occurrence with ``start <= at < end`` (aware instants), in order."""
    start = parse_instant(start, name="start").astimezone(UTC)
    end = parse_instant(end, name="end").astimezone(UTC)
    if periodic.not_before is not None and start < periodic.not_before:
        start = periodic.not_before
    rule = periodic.rule
    if isinstance(rule, Every):
        return _every(periodic, rule, start, end)
    if isinstance(rule, Cron):
        return _cron(periodic, rule, start, end)
    return iter([_utc(periodic, rule.at)] if start <= rule.at < end else [])


def classify(periodic: Periodic, since: datetime, now: datetime, limit: int) -> tuple[Backlog, int]:
    """The latest ``limit`` occurrences in ``(since, now]`` split by whether their window
    is still open (as :func:`.schedules.classify`), and how many earlier ones in that
    span were left out (neither due nor missed: not looked at)."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    start, end = since + _TICK, now + _TICK
    left_out = 0
    rule = periodic.rule
    if isinstance(rule, Every):
        # the grid is arithmetic: skip straight to the latest ``limit`` points
        floor = end - rule.every * limit
        if floor > start:
            left_out = _index(periodic, rule, floor) - _index(periodic, rule, start)
            start = floor
    latest: deque[Occurrence] = deque(maxlen=limit)
    seen = 0
    for occurrence in occurrences(periodic, start, end):
        latest.append(occurrence)
        seen += 1
    left_out += seen - len(latest)
    due = tuple(occurrence for occurrence in latest if now < occurrence.deadline)
    missed = tuple(occurrence for occurrence in latest if now >= occurrence.deadline)
    return Backlog(due, missed), left_out


def _utc(periodic: Periodic, at: datetime) -> Occurrence:
    return Occurrence(
        at=at,
        local=at.replace(tzinfo=None),
        zone="UTC",
        deadline=at + periodic.window,
        resolution="exact",
        schedule=periodic.name,
    )


def _index(periodic: Periodic, rule: Every, instant: datetime) -> int:
    """The k of the first grid point at or after ``instant`` (none before the anchor or
    ``not_before``)."""
    k = -((rule.anchor - instant) // rule.every)  # ceiling division
    lowest = 0
    if periodic.not_before is not None:
        lowest = max(0, -((rule.anchor - periodic.not_before) // rule.every))
    return max(k, lowest)


def _every(periodic: Periodic, rule: Every, start: datetime, end: datetime) -> Iterator[Occurrence]:
    k = _index(periodic, rule, start)
    while (at := rule.anchor + rule.every * k) < end:
        yield _utc(periodic, at)
        k += 1


def _cron(periodic: Periodic, rule: Cron, start: datetime, end: datetime) -> Iterator[Occurrence]:
    # one local time a day per (hour, minute), each by the DST policy of .schedules,
    # merged in instant order; at one instant the wall time that exists comes first
    weekdays = frozenset(7 if day == 0 else day for day in rule.days_of_week)
    streams = [
        local_occurrences(
            LocalSchedule(time(hour, minute), rule.zone, periodic.window, weekdays, periodic.name),
            start,
            end,
        )
        for hour in sorted(rule.hours)
        for minute in sorted(rule.minutes)
    ]
    previous: datetime | None = None
    for occurrence in heapq.merge(*streams, key=lambda o: (o.at, o.resolution != "exact")):
        if occurrence.local.day not in rule.days_of_month:
            continue
        if occurrence.local.month not in rule.months:
            continue
        if occurrence.at == previous:
            continue  # a wall time the clock skipped, shifted onto one that exists: once
        previous = occurrence.at
        yield occurrence


__all__ = ["EPOCH", "Cron", "Every", "Once", "Periodic", "Rule", "classify", "occurrences"]
