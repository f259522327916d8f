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

Occurrences are found by seeking, never by walking the span: an interval's by
arithmetic on its grid, a crontab's date by date through only the dates its fields name
(:func:`latest_first` from the end of the span), so the work of finding the latest
``limit`` of a 68-year span is that of a 10-day one.

Pure: no clock reads, no Celery. Instants in and out are aware UTC datetimes.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from calendar import monthrange
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from itertools import islice
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..errors import InvalidDeadline
from .budgets import parse_duration, parse_instant
from .schedules import Backlog, Occurrence, resolve

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


@dataclass(frozen=True, slots=True)
class LeftOut:
    """The occurrences of a span older than the latest ``limit`` looked at (neither due
    nor missed: not looked at): the first and the last of them."""

    first: Occurrence
    last: Occurrence


def occurrences(periodic: Periodic, start: datetime, end: datetime) -> Iterator[Occurrence]:
    """Every occurrence with ``start <= at < end`` (aware instants), in order."""
    start, end = _span(periodic, start, end)
    rule = periodic.rule
    if isinstance(rule, Every):
        return _every(periodic, rule, start, end)
    if isinstance(rule, Cron):
        return _Crontab(periodic, rule, start, end).forward()
    return iter([_utc(periodic, rule.at)] if start <= rule.at < end else [])


def latest_first(periodic: Periodic, start: datetime, end: datetime) -> Iterator[Occurrence]:
    """The occurrences of :func:`occurrences`, the latest first."""
    start, end = _span(periodic, start, end)
    rule = periodic.rule
    if isinstance(rule, Every):
        return _every_latest_first(periodic, rule, start, end)
    if isinstance(rule, Cron):
        return _Crontab(periodic, rule, start, end).backward()
    return iter([_utc(periodic, rule.at)] if start <= rule.at < end else [])


def classify(
    periodic: Periodic, since: datetime, now: datetime, limit: int
) -> tuple[Backlog, LeftOut | None]:
    """The latest ``limit`` occurrences in ``(since, now]`` split by whether their window
    is still open (as :func:`.schedules.classify`), and the earlier ones in that span
    that were left out (neither due nor missed: not looked at), if any.

    Found from ``now`` backwards, by seeking: the work does not grow with the span."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    start, end = since + _TICK, now + _TICK
    newest = latest_first(periodic, start, end)
    latest = list(islice(newest, limit))
    latest.reverse()
    older = next(newest, None)
    left_out = None
    if older is not None:
        first = next(occurrences(periodic, start, end), older)
        left_out = LeftOut(first, older)
    due = tuple(occurrence for occurrence in latest if now < occurrence.deadline)
    missed = tuple(occurrence for occurrence in latest if now >= occurrence.deadline)
    return Backlog(due, missed), left_out


def _span(periodic: Periodic, start: datetime, end: datetime) -> tuple[datetime, datetime]:
    start = parse_instant(start, name="start").astimezone(UTC)
    end = parse_instant(end, name="end").astimezone(UTC)
    if periodic.not_before is not None and start < periodic.not_before:
        start = periodic.not_before
    return start, end


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


def _every_latest_first(
    periodic: Periodic, rule: Every, start: datetime, end: datetime
) -> Iterator[Occurrence]:
    lowest = _index(periodic, rule, start)
    k = _index(periodic, rule, end) - 1  # the grid is arithmetic: straight to the latest
    while k >= lowest:
        yield _utc(periodic, rule.anchor + rule.every * k)
        k -= 1


#: The longest each month can be (a crontab naming only the 30th of February names nothing).
_LONGEST = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
#: Every offset from UTC is less than a day (Python's bound, and every zone's): a wall
#: time of a local date falls within a day either side of that date read as UTC.
_DAY = timedelta(days=1)
#: A candidate's order: its instant, then the wall time that exists before a shifted
#: one, then the crontab's order of its wall times (hours, then minutes), then its date.
_Key = tuple[datetime, bool, int, int]


class _Crontab:
    """A crontab's occurrences in ``[start, end)``, by seeking: only the local dates its
    month, day and weekday fields name are visited, and from one to the next the seek
    passes a month at a time through the months it names, so the work of finding the
    next (or the previous) occurrence does not grow with the span.

    The result is that of one stream of :func:`.schedules.occurrences` per wall time
    (hour, minute) on the crontab's weekdays, over the local dates from the day before
    ``start`` to the day after ``end``, merged in instant order, the month and day fields
    then applied, and one occurrence kept per instant (the one that exists, else the
    first in the crontab's order). Within a stream, a wall time whose instant is that of
    the same wall time on the stream's previous date (a zone that skipped a whole day)
    is left out: the earlier date's runs.
    """

    def __init__(self, periodic: Periodic, rule: Cron, start: datetime, end: datetime):
        info = ZoneInfo(rule.zone)
        self.periodic, self.rule, self.start, self.end = periodic, rule, start, end
        self.first = _date_after(start.astimezone(info).date(), -1)
        self.last = _date_after(end.astimezone(info).date(), 1)
        self.weekdays = frozenset(7 if day == 0 else day for day in rule.days_of_week)
        self.days = sorted(rule.days_of_month)
        self.months = sorted(rule.months)
        self.times = [
            time(hour, minute) for hour in sorted(rule.hours) for minute in sorted(rule.minutes)
        ]
        #: some month it names has some day it names
        self.possible = any(
            day <= _LONGEST[month - 1] for month in self.months for day in self.days
        )
        #: each visited date's wall times resolved, for the next date's stream check
        self._resolved: dict[date, list[tuple[datetime, str]]] = {}

    def forward(self) -> Iterator[Occurrence]:
        pending: list[tuple[_Key, Occurrence]] = []
        previous: datetime | None = None
        day = self._next_day(self.first)
        while day is not None:
            # every wall time of this date or a later one is after this
            horizon = _midnight(day, -1)
            while pending and pending[0][0][0] < horizon:
                key, occurrence = heapq.heappop(pending)
                if key[0] != previous:
                    previous = key[0]
                    yield occurrence
            for candidate in self._candidates(day):
                heapq.heappush(pending, candidate)
            day = self._next_day(day + _DAY) if day < self.last else None
        while pending:
            key, occurrence = heapq.heappop(pending)
            if key[0] != previous:
                previous = key[0]
                yield occurrence

    def backward(self) -> Iterator[Occurrence]:
        pending: list[tuple[_Key, Occurrence]] = []
        day = self._previous_day(self.last)
        while day is not None:
            # every wall time of this date or an earlier one is before this
            horizon = _midnight(day, 2)
            ready = [candidate for candidate in pending if candidate[0][0] >= horizon]
            if ready:
                pending = [candidate for candidate in pending if candidate[0][0] < horizon]
                yield from _latest_first(ready)
            pending.extend(self._candidates(day))
            day = self._previous_day(day - _DAY) if day > self.first else None
        yield from _latest_first(pending)

    def _candidates(self, day: date) -> Iterator[tuple[_Key, Occurrence]]:
        """The wall times of ``day`` (a date the crontab names) whose instants are in
        the span, each with its order."""
        resolved = self._resolved_on(day)
        prior = self._prior(day)
        before = self._resolved_on(prior) if prior is not None else None
        for index, (at, how) in enumerate(resolved):
            if not self.start <= at < self.end:
                continue
            if before is not None and before[index][0] == at:
                continue  # a zone that skipped a day: the skipped date's run, once
            local = datetime.combine(day, self.times[index])
            occurrence = Occurrence(
                at=at,
                local=local,
                zone=self.rule.zone,
                deadline=at + self.periodic.window,
                resolution=how,
                schedule=self.periodic.name,
            )
            yield (at, how != "exact", index, day.toordinal()), occurrence

    def _resolved_on(self, day: date) -> list[tuple[datetime, str]]:
        found = self._resolved.get(day)
        if found is None:
            zone = self.rule.zone
            found = [resolve(datetime.combine(day, at), zone) for at in self.times]
            if len(self._resolved) > 16:  # only the neighbours are asked again
                self._resolved = {
                    kept: values
                    for kept, values in self._resolved.items()
                    if abs((kept - day).days) <= 8
                }
            self._resolved[day] = found
        return found

    def _prior(self, day: date) -> date | None:
        """The date before ``day`` on the crontab's weekdays (its stream's previous date),
        if it is within the dates looked at."""
        prior = day
        while prior > self.first:
            prior -= _DAY
            if prior.isoweekday() in self.weekdays:
                return prior
        return None

    def _next_day(self, day: date) -> date | None:
        """The first date from ``day`` to the last looked at whose month, day of the month
        and weekday the crontab names."""
        if not self.possible:
            return None
        year, month, earliest = day.year, day.month, day.day
        if month not in self.rule.months:
            year, month, earliest = *_month_after(self.months, year, month), 1
        while (year, month) <= (self.last.year, self.last.month):
            length = monthrange(year, month)[1]
            weekday = date(year, month, 1).isoweekday()
            for number in self.days:
                if number > length:
                    break
                if number >= earliest and (weekday + number - 2) % 7 + 1 in self.weekdays:
                    found = date(year, month, number)
                    return found if found <= self.last else None
            year, month, earliest = *_month_after(self.months, year, month), 1
        return None

    def _previous_day(self, day: date) -> date | None:
        """The last date from the first looked at to ``day`` whose month, day of the month
        and weekday the crontab names."""
        if not self.possible:
            return None
        year, month, latest = day.year, day.month, day.day
        if month not in self.rule.months:
            year, month, latest = *_month_before(self.months, year, month), 31
        while (year, month) >= (self.first.year, self.first.month):
            length = monthrange(year, month)[1]
            weekday = date(year, month, 1).isoweekday()
            for number in reversed(self.days):
                if number > min(length, latest):
                    continue
                if (weekday + number - 2) % 7 + 1 in self.weekdays:
                    found = date(year, month, number)
                    return found if found >= self.first else None
            year, month, latest = *_month_before(self.months, year, month), 31
        return None


def _month_after(months: list[int], year: int, month: int) -> tuple[int, int]:
    """The first of ``months`` (sorted) after ``month`` of ``year``."""
    later = bisect_right(months, month)
    return (year, months[later]) if later < len(months) else (year + 1, months[0])


def _month_before(months: list[int], year: int, month: int) -> tuple[int, int]:
    """The last of ``months`` (sorted) before ``month`` of ``year``."""
    earlier = bisect_left(months, month)
    return (year, months[earlier - 1]) if earlier > 0 else (year - 1, months[-1])


def _midnight(day: date, days: int) -> datetime:
    """``day``'s midnight read as UTC, ``days`` later (within the range of datetimes)."""
    try:
        return datetime.combine(day, time(), tzinfo=UTC) + timedelta(days=days)
    except OverflowError:
        return datetime.min.replace(tzinfo=UTC) if days < 0 else datetime.max.replace(tzinfo=UTC)


def _date_after(day: date, days: int) -> date:
    """``days`` after ``day`` (within the range of dates)."""
    try:
        return day + timedelta(days=days)
    except OverflowError:
        return date.min if days < 0 else date.max


def _latest_first(candidates: list[tuple[_Key, Occurrence]]) -> Iterator[Occurrence]:
    """One occurrence per instant, the first in order, the latest instant first."""
    candidates.sort(key=lambda candidate: candidate[0])
    kept: list[Occurrence] = []
    for key, occurrence in candidates:
        if not kept or kept[-1].at != key[0]:
            kept.append(occurrence)
    return reversed(kept)


__all__ = [
    "EPOCH",
    "Cron",
    "Every",
    "LeftOut",
    "Once",
    "Periodic",
    "Rule",
    "classify",
    "latest_first",
    "occurrences",
]
