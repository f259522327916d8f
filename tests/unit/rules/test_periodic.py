"""The occurrences of a django-celery-beat row's schedule (pure): an interval on its grid,
a crontab in its zone by the one DST policy, one instant; and the bounded catch-up."""

from __future__ import annotations

import heapq
import sys
from collections.abc import Iterator, Set
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from celery_deadlines.errors import InvalidDeadline
from celery_deadlines.rules import periodic as periodic_module
from celery_deadlines.rules.periodic import (
    Cron,
    Every,
    Once,
    Periodic,
    classify,
    latest_first,
    occurrences,
)
from celery_deadlines.rules.schedules import LocalSchedule
from celery_deadlines.rules.schedules import occurrences as local_occurrences

ALL_MINUTES = frozenset(range(60))
ALL_HOURS = frozenset(range(24))
ALL_WEEK = frozenset(range(7))
ALL_MONTH = frozenset(range(1, 32))
ALL_YEAR = frozenset(range(1, 13))
NOON = datetime(2026, 8, 19, 12, 0, tzinfo=UTC)


def cron(minutes: Set[int], hours: Set[int], zone: str = "Europe/Berlin", **sets: Set[int]) -> Cron:
    return Cron(
        frozenset(minutes),
        frozenset(hours),
        frozenset(sets.get("days_of_week", ALL_WEEK)),
        frozenset(sets.get("days_of_month", ALL_MONTH)),
        frozenset(sets.get("months", ALL_YEAR)),
        zone,
    )


def ids(periodic: Periodic, start: datetime, end: datetime) -> list[str]:
    return [occurrence.run_id for occurrence in occurrences(periodic, start, end)]


def test_an_interval_falls_on_the_epoch_grid_whenever_it_is_asked() -> None:
    every = Periodic(Every(timedelta(seconds=20)), timedelta(seconds=5), "poll")
    late = NOON + timedelta(seconds=7)
    found = list(occurrences(every, late, NOON + timedelta(minutes=1)))
    assert [o.at for o in found] == [NOON + timedelta(seconds=s) for s in (20, 40)]
    assert found[0].run_id == "poll:UTC@2026-08-19T12:00:20"
    assert found[0].deadline == NOON + timedelta(seconds=25)
    # asked from another instant (a restart, a second beat): the same instants
    assert ids(every, NOON, NOON + timedelta(minutes=1))[1:] == [o.run_id for o in found]


def test_an_interval_counts_from_its_start_time_and_has_nothing_before_it() -> None:
    start = NOON + timedelta(seconds=3)
    every = Periodic(Every(timedelta(seconds=10), start), timedelta(seconds=5), "p", start)
    found = list(occurrences(every, NOON - timedelta(minutes=1), NOON + timedelta(seconds=30)))
    assert [o.at for o in found] == [
        start,
        start + timedelta(seconds=10),
        start + timedelta(seconds=20),
    ]


def test_a_catch_up_looks_at_the_latest_occurrences_only_and_names_the_rest() -> None:
    every = Periodic(Every(timedelta(seconds=1)), timedelta(seconds=3), "tick")
    since = NOON - timedelta(days=1)
    backlog, left_out = classify(every, since, NOON, limit=10)
    assert [o.at for o in backlog.due] == [NOON - timedelta(seconds=s) for s in (2, 1, 0)]
    assert [o.at for o in backlog.missed] == [NOON - timedelta(seconds=s) for s in range(9, 2, -1)]
    # one a second in (since, now]: all but the last 10 left out
    assert left_out is not None
    assert (left_out.first.at, left_out.last.at) == (
        since + timedelta(seconds=1), NOON - timedelta(seconds=10),
    )  # fmt: skip
    assert classify(every, NOON - timedelta(seconds=10), NOON, limit=10)[1] is None


def test_a_cron_catch_up_keeps_the_latest_and_names_the_rest() -> None:
    hourly = Periodic(cron({0}, ALL_HOURS, "UTC"), timedelta(minutes=10), "hourly")
    backlog, left_out = classify(hourly, NOON - timedelta(hours=5), NOON + timedelta(minutes=5), 3)
    assert [o.at for o in backlog.due] == [NOON]
    assert [o.at.hour for o in backlog.missed] == [10, 11]
    # 08:00 and 09:00 (07:00 is ``since`` itself: not in the span)
    assert left_out is not None
    assert (left_out.first.at.hour, left_out.last.at.hour) == (8, 9)


def test_a_crontab_runs_at_its_wall_times_in_its_zone() -> None:
    # 09:30 on weekdays, Berlin (CEST in August: 07:30 UTC)
    weekdays = Periodic(
        cron({30}, {9}, days_of_week={1, 2, 3, 4, 5}), timedelta(minutes=5), "digest"
    )
    friday = datetime(2026, 8, 21, tzinfo=UTC)
    found = list(occurrences(weekdays, friday, friday + timedelta(days=4)))
    assert [o.run_id for o in found] == [
        "digest:Europe/Berlin@2026-08-21T09:30:00",
        "digest:Europe/Berlin@2026-08-24T09:30:00",  # Saturday and Sunday skipped
    ]
    assert found[0].at == friday + timedelta(hours=7, minutes=30)


def test_a_crontabs_day_of_month_and_day_of_week_must_both_match_as_celery_reads_them() -> None:
    # the 13th, if it is a Friday (Celery's crontab: both day fields hold)
    friday_13th = Periodic(
        cron({0}, {12}, "UTC", days_of_week={5}, days_of_month={13}), timedelta(hours=1), "f13"
    )
    year = datetime(2026, 1, 1, tzinfo=UTC)
    found = list(occurrences(friday_13th, year, year + timedelta(days=365)))
    assert [o.local.date().isoformat() for o in found] == ["2026-02-13", "2026-03-13", "2026-11-13"]


def test_a_crontab_hour_the_spring_transition_skips_runs_once_per_instant() -> None:
    # 29 March 2026, Berlin: 02:00 jumps to 03:00. "minute 0 and 30 of hours 2 and 3":
    # 02:00 and 02:30 do not exist; shifted, they land on 03:00 and 03:30, which do
    every = Periodic(cron({0, 30}, {2, 3}), timedelta(minutes=5), "night")
    day = datetime(2026, 3, 29, tzinfo=UTC)
    found = list(occurrences(every, day, day + timedelta(days=1)))
    assert [(o.local.time().isoformat(), o.at.isoformat(), o.resolution) for o in found] == [
        ("03:00:00", "2026-03-29T01:00:00+00:00", "exact"),
        ("03:30:00", "2026-03-29T01:30:00+00:00", "exact"),
    ]


def test_a_crontab_time_the_autumn_transition_repeats_runs_once_at_its_first() -> None:
    # 25 October 2026, Berlin: 03:00 falls back to 02:00; 02:30 happens twice
    nightly = Periodic(cron({30}, {2}), timedelta(minutes=5), "night")
    day = datetime(2026, 10, 24, 12, tzinfo=UTC)
    found = list(occurrences(nightly, day, day + timedelta(days=1)))
    assert [(o.at.isoformat(), o.resolution) for o in found] == [
        ("2026-10-25T00:30:00+00:00", "fold")
    ]


def test_a_skipped_wall_time_with_no_neighbour_is_shifted_not_lost() -> None:
    only = Periodic(cron({30}, {2}), timedelta(minutes=5), "night")
    day = datetime(2026, 3, 29, tzinfo=UTC)
    found = list(occurrences(only, day, day + timedelta(days=1)))
    assert [(o.run_id, o.at.isoformat(), o.resolution) for o in found] == [
        ("night:Europe/Berlin@2026-03-29T02:30:00", "2026-03-29T01:30:00+00:00", "gap")
    ]


def test_a_clocked_schedule_has_its_one_instant() -> None:
    once = Periodic(Once(NOON), timedelta(minutes=1), "launch")
    assert ids(once, NOON - timedelta(hours=1), NOON + timedelta(hours=1)) == [
        "launch:UTC@2026-08-19T12:00:00"
    ]
    assert ids(once, NOON + timedelta(seconds=1), NOON + timedelta(hours=1)) == []


def test_a_bad_rule_is_refused_with_what_is_wrong() -> None:
    with pytest.raises(InvalidDeadline, match="minutes must be a non-empty set within 0-59"):
        cron({60}, {1})
    with pytest.raises(InvalidDeadline, match="unknown time zone"):
        cron({0}, {1}, "Mars/Olympus")
    with pytest.raises(InvalidDeadline, match="needs a name"):
        Periodic(Every(timedelta(seconds=1)), timedelta(seconds=1), "")
    with pytest.raises(InvalidDeadline, match="naive"):
        Every(timedelta(seconds=1), datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="limit"):
        classify(Periodic(Once(NOON), timedelta(1), "x"), NOON, NOON, 0)


# -- seeking, not walking -------------------------------------------------------------


def walked(periodic: Periodic, start: datetime, end: datetime) -> Iterator[Any]:
    """A crontab's occurrences as this module found them before it seeked: one stream of
    the zoned schedule per wall time, walked day by day over the whole span, merged in
    instant order, the day fields applied, one occurrence per instant."""
    rule = periodic.rule
    assert isinstance(rule, Cron)
    if periodic.not_before is not None and start < periodic.not_before:
        start = periodic.not_before
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
    previous = None
    for occurrence in heapq.merge(*streams, key=lambda o: (o.at, o.resolution != "exact")):
        if occurrence.local.day not in rule.days_of_month:
            continue
        if occurrence.local.month not in rule.months:
            continue
        if occurrence.at == previous:
            continue
        previous = occurrence.at
        yield occurrence


#: zones with every kind of transition: none, an hour at 02:00 either way, at midnight
#: (Sao Paulo, Havana), half an hour (Lord Howe), two hours (Troll), a negative DST
#: (Dublin), a whole day skipped (Apia, 30 December 2011), Ramadan's (Casablanca)
ZONES = [
    "UTC", "Europe/Berlin", "America/New_York", "America/Sao_Paulo", "America/Havana",
    "Australia/Lord_Howe", "Antarctica/Troll", "Europe/Dublin", "Pacific/Apia",
    "Africa/Casablanca", "Asia/Tehran", "Pacific/Chatham",
]  # fmt: skip
#: days around which many zones change their clocks (either hemisphere), and Apia's
TRANSITIONS = [(3, 8), (3, 25), (4, 1), (9, 25), (10, 1), (10, 25), (11, 1), (12, 28)]


@st.composite
def crontabs(draw: st.DrawFn) -> Cron:
    def some(values: range, size: int) -> frozenset[int]:
        whole = st.just(frozenset(values))
        return draw(
            st.one_of(whole, st.frozensets(st.sampled_from(values), min_size=1, max_size=size))
        )

    return Cron(
        some(range(60), 3), some(range(24), 4), some(range(7), 4),
        some(range(1, 32), 6), some(range(1, 13), 4), draw(st.sampled_from(ZONES)),
    )  # fmt: skip


@st.composite
def instants(draw: st.DrawFn) -> datetime:
    """Any instant of 1990-2040, or one within a week of a transition's usual days."""
    anywhere = st.datetimes(datetime(1990, 1, 1), datetime(2040, 1, 1), timezones=st.just(UTC))
    month, day = draw(st.sampled_from(TRANSITIONS))
    near = datetime(draw(st.integers(1990, 2039)), month, day, tzinfo=UTC)
    close = st.timedeltas(timedelta(days=-7), timedelta(days=7)).map(lambda d: near + d)
    return draw(st.one_of(anywhere, close))


@given(
    rule=crontabs(),
    start=instants(),
    span=st.timedeltas(timedelta(0), timedelta(days=10)),
    not_before=st.none() | st.timedeltas(timedelta(days=-1), timedelta(days=3)),
    limit=st.integers(1, 40),
)
@example(  # Apia skipped 30 December 2011: its wall times ran once, on the 30th's
    rule=Cron(frozenset({0, 30}), frozenset(range(24)), frozenset(range(7)),
              frozenset(range(1, 32)), frozenset(range(1, 13)), "Pacific/Apia"),
    start=datetime(2011, 12, 28, tzinfo=UTC), span=timedelta(days=5), not_before=None, limit=40,
)  # fmt: skip
@example(  # Berlin's spring gap shifted onto wall times that exist; its autumn fold
    rule=Cron(frozenset(range(60)), frozenset({1, 2, 3}), frozenset(range(7)),
              frozenset(range(1, 32)), frozenset(range(1, 13)), "Europe/Berlin"),
    start=datetime(2026, 3, 28, tzinfo=UTC), span=timedelta(days=2), not_before=None, limit=40,
)  # fmt: skip
def test_seeking_a_crontabs_occurrences_finds_what_the_walk_found(
    rule: Cron, start: datetime, span: timedelta, not_before: timedelta | None, limit: int
) -> None:
    periodic = Periodic(
        rule, timedelta(hours=1), "p", None if not_before is None else start + not_before
    )
    end = start + span
    walk = list(walked(periodic, start, end))
    assert list(occurrences(periodic, start, end)) == walk
    assert list(latest_first(periodic, start, end)) == walk[::-1]
    since = start - timedelta(microseconds=1)  # classify reads (since, now]
    now = end - timedelta(microseconds=1)
    backlog, left_out = classify(periodic, since, now, limit)
    assert [*backlog.missed, *backlog.due] == walk[-limit:]
    assert all(now >= o.deadline for o in backlog.missed)
    assert all(now < o.deadline for o in backlog.due)
    if len(walk) > limit:
        assert left_out is not None
        assert (left_out.first, left_out.last) == (walk[0], walk[-limit - 1])
    else:
        assert left_out is None


class Steps:
    """Lines run in the rules package (``rules/``) while it is on, up to ``cap``."""

    RULES = str(Path(periodic_module.__file__).parent)

    def __init__(self, cap: int) -> None:
        self.cap, self.count = cap, 0

    def __enter__(self) -> Steps:
        sys.settrace(self._call)
        return self

    def __exit__(self, *_: object) -> None:
        sys.settrace(None)

    def _call(self, frame: FrameType, event: str, arg: object) -> Any:
        return self._line if frame.f_code.co_filename.startswith(self.RULES) else None

    def _line(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "line":
            self.count += 1
            if self.count > self.cap:
                raise AssertionError(f"more than {self.cap} steps")
        return self._line


def steps_to_classify(periodic: Periodic, cap: int = 2_000_000) -> int:
    with Steps(cap) as steps:
        classify(periodic, NOON - periodic.window, NOON, 500)
    return steps.count


#: the longest ``expire_seconds`` a PeriodicTask row can hold: 68 years
LONGEST_ROW_WINDOW = timedelta(seconds=2_147_483_647)


def test_finding_a_crontabs_latest_occurrences_costs_the_same_for_ten_days_and_68_years() -> None:
    every_minute = cron(ALL_MINUTES, ALL_HOURS)  # Berlin, DST and all
    ten_days = steps_to_classify(Periodic(every_minute, timedelta(days=10), "row"))
    # the walk took some 40 000 steps a day: 68 years would be about a billion
    years = steps_to_classify(Periodic(every_minute, LONGEST_ROW_WINDOW, "row"), 2 * ten_days)
    assert years <= ten_days * 1.05  # the first left out is found on another date
    assert ten_days < 200_000


def test_finding_a_sparse_crontabs_occurrences_is_bounded_by_the_limit_not_the_window() -> None:
    # daily at noon: the latest 500 of 68 years or of a century, the same work
    daily = cron({0}, {12})
    decades = steps_to_classify(Periodic(daily, LONGEST_ROW_WINDOW, "row"))
    century = steps_to_classify(Periodic(daily, timedelta(days=36_500), "row"), 2 * decades)
    assert century <= decades * 1.05
    # noon on the 29th of February when it is a Monday (2016, 2044, 2072): three in 68
    # years, each found by passing one February a year, not the days between
    leap_monday = cron({0}, {12}, "UTC", days_of_week={1}, days_of_month={29}, months={2})
    assert steps_to_classify(Periodic(leap_monday, LONGEST_ROW_WINDOW, "row")) < decades


def test_a_crontab_that_names_no_date_has_no_occurrence_and_costs_nothing_to_ask() -> None:
    never = Periodic(
        cron({0}, {12}, "UTC", days_of_month={30, 31}, months={2}), LONGEST_ROW_WINDOW, "x"
    )
    assert steps_to_classify(never, 200) < 200
    assert list(occurrences(never, NOON - LONGEST_ROW_WINDOW, NOON)) == []


def test_a_crontab_has_its_occurrences_at_both_ends_of_the_calendar() -> None:
    noon = Periodic(cron({0}, {12}, "UTC"), timedelta(hours=1), "x")
    first, last = datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, tzinfo=UTC)
    assert [o.at.day for o in occurrences(noon, first, first + timedelta(days=2))] == [1, 2]
    assert [o.at.day for o in latest_first(noon, last - timedelta(days=2), last)] == [31, 30]
