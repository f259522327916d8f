"""The occurrences of a django-celery-beat row's schedule (pure): an interval on its grid,
a crontab in its zone by the one DST policy, one instant; and the bounded catch-up."""

from __future__ import annotations

from collections.abc import Set
from datetime import UTC, datetime, timedelta

import pytest

from celery_deadlines.errors import InvalidDeadline
from celery_deadlines.rules.periodic import Cron, Every, Once, Periodic, classify, occurrences

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


def test_a_catch_up_looks_at_the_latest_occurrences_only_and_counts_the_rest() -> None:
    every = Periodic(Every(timedelta(seconds=1)), timedelta(seconds=3), "tick")
    since = NOON - timedelta(days=1)
    backlog, left_out = classify(every, since, NOON, limit=10)
    assert [o.at for o in backlog.due] == [NOON - timedelta(seconds=s) for s in (2, 1, 0)]
    assert [o.at for o in backlog.missed] == [NOON - timedelta(seconds=s) for s in range(9, 2, -1)]
    assert left_out == 86_400 - 10  # one a second in (since, now], all but the last 10


def test_a_cron_catch_up_keeps_the_latest_and_counts_the_rest() -> None:
    hourly = Periodic(cron({0}, ALL_HOURS, "UTC"), timedelta(minutes=10), "hourly")
    backlog, left_out = classify(hourly, NOON - timedelta(hours=5), NOON + timedelta(minutes=5), 3)
    assert [o.at for o in backlog.due] == [NOON]
    assert [o.at.hour for o in backlog.missed] == [10, 11]
    assert left_out == 2  # 08:00 and 09:00 (07:00 is ``since`` itself: not in the span)


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
