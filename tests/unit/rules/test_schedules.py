"""Zoned schedules resolved to UTC occurrences: DST gaps and folds of 2026, outages."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

import pytest

from celery_deadlines.errors import InvalidDeadline
from celery_deadlines.rules.schedules import (
    WEEKDAYS,
    LocalSchedule,
    classify,
    occurrences,
    resolve,
)

FIVE_MINUTES = timedelta(minutes=5)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def daily(at: str, zone: str, window: timedelta = FIVE_MINUTES) -> LocalSchedule:
    return LocalSchedule(time.fromisoformat(at), zone, window)


def test_every_weekday_at_nine_in_berlin_follows_the_spring_change_in_utc() -> None:
    schedule = LocalSchedule(time(9, 0), "Europe/Berlin", FIVE_MINUTES, WEEKDAYS)
    found = list(occurrences(schedule, utc("2026-03-26T00:00"), utc("2026-04-01T00:00")))
    assert [o.at for o in found] == [
        utc("2026-03-26T08:00"), utc("2026-03-27T08:00"),  # CET, UTC+1
        utc("2026-03-30T07:00"), utc("2026-03-31T07:00"),  # CEST, UTC+2; no weekend
    ]  # fmt: skip
    assert {o.zone for o in found} == {"Europe/Berlin"}
    assert all(o.deadline - o.not_before == FIVE_MINUTES for o in found)


@pytest.mark.parametrize(
    ("zone", "day", "at", "instant"),
    [
        ("Europe/Berlin", "2026-03-29", "02:30", "2026-03-29T01:30"),  # the wall clock reads 03:30
        ("America/New_York", "2026-03-08", "02:30", "2026-03-08T07:30"),  # reads 03:30 EDT
    ],
    ids=["eu-spring-2026", "us-spring-2026"],
)
def test_a_local_time_that_does_not_exist_is_shifted_not_skipped(
    zone: str, day: str, at: str, instant: str
) -> None:
    found = list(occurrences(daily(at, zone), utc(f"{day}T00:00"), utc(f"{day}T23:59")))
    assert [(o.at, o.resolution) for o in found] == [(utc(instant), "gap")]


@pytest.mark.parametrize(
    ("zone", "day", "at", "first"),
    [
        ("Europe/Berlin", "2026-10-25", "02:30", "2026-10-25T00:30"),  # CEST, not 01:30 CET
        ("America/New_York", "2026-11-01", "01:30", "2026-11-01T05:30"),  # EDT, not 06:30 EST
    ],
    ids=["eu-autumn-2026", "us-autumn-2026"],
)
def test_a_local_time_that_happens_twice_runs_once_at_its_first_occurrence(
    zone: str, day: str, at: str, first: str
) -> None:
    found = list(occurrences(daily(at, zone), utc(f"{day}T00:00") - timedelta(hours=6),
                             utc(f"{day}T23:59")))  # fmt: skip
    on_the_day = [o for o in found if o.local.date().isoformat() == day]
    assert [(o.at, o.resolution) for o in on_the_day] == [(utc(first), "fold")]


@pytest.mark.parametrize("window_minutes", [30, 90, 150])
def test_a_window_straddling_the_us_fall_back_is_exactly_its_utc_length(
    window_minutes: int,
) -> None:
    # 01:30 local on 2026-11-01 in New York: the clock falls back at 02:00 EDT
    schedule = daily("01:30", "America/New_York", timedelta(minutes=window_minutes))
    [occurrence] = occurrences(schedule, utc("2026-11-01T00:00"), utc("2026-11-02T00:00"))
    assert occurrence.deadline - occurrence.at == timedelta(minutes=window_minutes)
    assert occurrence.at == utc("2026-11-01T05:30")


def test_resolving_a_plain_local_time_is_exact() -> None:
    nine = datetime(2026, 6, 1, 9, 0)
    assert resolve(nine, "Europe/Berlin") == (utc("2026-06-01T07:00"), "exact")


def test_after_an_outage_passed_windows_are_missed_and_an_open_one_is_due() -> None:
    schedule = daily("09:00", "Europe/Berlin")  # 07:00 UTC in summer
    backlog = classify(schedule, since=utc("2026-06-01T06:00"), now=utc("2026-06-03T07:02"))
    assert [o.at for o in backlog.missed] == [utc("2026-06-01T07:00"), utc("2026-06-02T07:00")]
    assert [o.at for o in backlog.due] == [utc("2026-06-03T07:00")]


def test_a_restart_on_an_occurrence_boundary_neither_loses_nor_doubles_it() -> None:
    schedule = daily("09:00", "Europe/Berlin")
    boundary = utc("2026-06-02T07:00")  # the scheduler restarts exactly at an occurrence
    before = classify(schedule, since=utc("2026-06-01T06:00"), now=boundary)
    after = classify(schedule, since=boundary, now=utc("2026-06-03T08:00"))
    ids = sorted(o.run_id for part in (before, after) for o in (*part.due, *part.missed))
    assert ids == [  # each once: none lost at the boundary, none seen by both checks
        "Europe/Berlin@2026-06-01T09:00:00",
        "Europe/Berlin@2026-06-02T09:00:00",
        "Europe/Berlin@2026-06-03T09:00:00",
    ]
    assert [o.run_id for o in before.due] == ["Europe/Berlin@2026-06-02T09:00:00"]


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"zone": "Europe/Berlinn"}, "unknown time zone"),
        ({"days": frozenset({0})}, "ISO weekdays 1-7"),
        ({"window": timedelta(0)}, "more than zero"),
        ({"at": time(9, 0, tzinfo=UTC)}, "local wall time"),
    ],
)
def test_a_schedule_that_cannot_work_is_refused(options: dict[str, object], complaint: str) -> None:
    fields: dict[str, object] = {"at": time(9, 0), "zone": "Europe/Berlin", "window": FIVE_MINUTES}
    with pytest.raises(InvalidDeadline, match=complaint):
        LocalSchedule(**{**fields, **options})  # type: ignore[arg-type]


def test_a_zone_that_skips_a_whole_day_still_runs_once() -> None:
    # Samoa skipped 2011-12-30 entirely: two local dates map to one instant
    found = list(occurrences(daily("09:00", "Pacific/Apia"), utc("2011-12-28T00:00"),
                             utc("2012-01-02T00:00")))  # fmt: skip
    instants = [o.at for o in found]
    assert len(instants) == len(set(instants))


def test_run_ids_name_their_schedule_and_windows_may_be_seconds() -> None:
    first = LocalSchedule(time(9, 0), "Europe/Berlin", 300, name="digest")  # type: ignore[arg-type]
    other = LocalSchedule(time(9, 0), "Europe/Berlin", FIVE_MINUTES, name="report")
    window = (utc("2026-06-01T00:00"), utc("2026-06-02T00:00"))
    [a], [b] = occurrences(first, *window), occurrences(other, *window)
    assert (a.run_id, b.run_id) == (
        "digest:Europe/Berlin@2026-06-01T09:00:00", "report:Europe/Berlin@2026-06-01T09:00:00",
    )  # fmt: skip
    assert a.deadline - a.at == FIVE_MINUTES
