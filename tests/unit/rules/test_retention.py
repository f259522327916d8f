"""Retention's pure rules: the setting, --older-than, the cutoff, the purge's interval."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery

from celery_deadlines import ConfigurationError, InvalidDeadline
from celery_deadlines.conf import RETENTION, Settings
from celery_deadlines.rules.retention import (
    DEFAULT_RETENTION,
    MAX_BATCH_SIZE,
    PURGE_INTERVAL,
    PurgeCounts,
    cutoff,
    describe_age,
    parse_age,
    parse_batch_size,
    parse_retention,
    purge_due,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
HOUR = PURGE_INTERVAL.total_seconds()


@pytest.mark.parametrize(
    ("text", "age"),
    [
        ("14d", timedelta(days=14)),
        ("36h", timedelta(hours=36)),
        ("90m", timedelta(minutes=90)),
        ("45s", timedelta(seconds=45)),
        ("2w", timedelta(weeks=2)),
        ("1d12h", timedelta(days=1, hours=12)),
        ("1.5h", timedelta(minutes=90)),
        (" 14D ", timedelta(days=14)),
        ("P14D", timedelta(days=14)),
        ("PT36H", timedelta(hours=36)),
        ("P1DT12H", timedelta(days=1, hours=12)),
        ("PT90M", timedelta(minutes=90)),
        ("PT0.5S", timedelta(seconds=0.5)),
        ("P2W", timedelta(weeks=2)),
        ("p2w", timedelta(weeks=2)),
        ("3600", timedelta(hours=1)),
        ("0.5", timedelta(seconds=0.5)),
    ],
)
def test_an_age_is_written_with_a_unit_as_an_iso_duration_or_in_seconds(
    text: str, age: timedelta
) -> None:
    assert parse_age(text, name="--older-than") == age


def test_an_age_given_as_a_number_or_a_timedelta_is_a_duration() -> None:
    assert parse_age(60, name="age") == timedelta(minutes=1)
    assert parse_age(timedelta(days=3), name="age") == timedelta(days=3)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "must be a number of seconds (3600), a number and a unit"),
        ("soon", "a number and a unit w, d, h, m or s"),
        ("14 days", "an ISO 8601 duration"),
        ("-5", "must be a number of seconds"),
        ("14x", "must be a number of seconds"),
        ("P", "an ISO 8601 duration"),
        ("PT", "an ISO 8601 duration"),
        ("P1DT", "an ISO 8601 duration"),
        ("P1M", "years and months have no fixed length"),
        ("P1Y2D", "years and months have no fixed length"),
        ("0d", "more than zero"),
        ("0", "more than zero"),
        ("PT0S", "more than zero"),
        ("99999999999999w", "too long"),
        ("9" * 400, "too long"),  # more than a float holds: infinite, never "zero"
    ],
)
def test_an_age_that_cannot_be_read_says_how_to_write_one(text: str, complaint: str) -> None:
    with pytest.raises(InvalidDeadline, match=r"--older-than") as refused:
        parse_age(text, name="--older-than")
    assert complaint in str(refused.value)


@pytest.mark.parametrize("off", [None, 0, 0.0, timedelta(0)])
def test_a_retention_of_none_or_zero_turns_the_periodic_purge_off(off: object) -> None:
    assert parse_retention(off, name="deadlines_retention") is None


@pytest.mark.parametrize(
    ("value", "complaint"),
    [(-1, "more than zero"), (math.nan, "finite"), ("14d", "str"), (True, "bool")],
)
def test_a_bad_retention_is_refused(value: object, complaint: str) -> None:
    with pytest.raises(InvalidDeadline, match=complaint):
        parse_retention(value, name="deadlines_retention")


def test_the_retention_setting_defaults_to_two_weeks_and_a_bad_one_names_itself() -> None:
    assert Settings({}).get(RETENTION) == DEFAULT_RETENTION == timedelta(days=14)
    assert Settings({"deadlines_retention": 3600}).get(RETENTION) == timedelta(hours=1)
    assert Settings({"deadlines_retention": None}).get(RETENTION) is None
    with pytest.raises(ConfigurationError, match="CELERY_DEADLINES_RETENTION") as refused:
        Settings({"deadlines_retention": "two weeks"}).get(RETENTION)
    assert "deadlines_retention" in str(refused.value)


def test_the_retention_setting_is_read_from_a_celery_app() -> None:
    from celery_deadlines.conf import settings_for

    app = Celery("retention-test", set_as_current=False)
    app.conf.deadlines_retention = timedelta(days=30)
    assert settings_for(app).get(RETENTION) == timedelta(days=30)


@pytest.mark.parametrize(("value", "size"), [(1, 1), ("500", 500), (MAX_BATCH_SIZE, 10_000)])
def test_a_batch_size_is_a_whole_number_up_to_the_bound(value: object, size: int) -> None:
    assert parse_batch_size(value, name="--batch-size") == size


@pytest.mark.parametrize(
    "value", [0, -1, "0", "ten", 1.5, True, MAX_BATCH_SIZE + 1, None, "9" * 5000]
)
def test_a_batch_size_outside_the_bound_is_refused(value: object) -> None:
    with pytest.raises(InvalidDeadline, match="--batch-size must be a whole number from 1"):
        parse_batch_size(value, name="--batch-size")


def test_the_cutoff_is_now_minus_the_age() -> None:
    assert cutoff(NOW, timedelta(days=14)) == datetime(2026, 11, 15, 12, 0, tzinfo=UTC)


def test_the_cutoff_refuses_a_naive_now_and_an_age_of_zero() -> None:
    with pytest.raises(InvalidDeadline, match="timezone-aware"):
        cutoff(NOW.replace(tzinfo=None), timedelta(days=1))
    with pytest.raises(InvalidDeadline, match="more than zero"):
        cutoff(NOW, timedelta(0))


def test_a_workers_first_pass_purges_and_the_next_waits_for_the_interval() -> None:
    assert purge_due(None, 100.0, behind=False)
    assert not purge_due(100.0, 100.0 + HOUR - 1, behind=False)
    assert purge_due(100.0, 100.0 + HOUR, behind=False)


def test_a_pass_that_stopped_at_its_batch_bound_goes_on_at_the_next_pass() -> None:
    assert purge_due(100.0, 101.0, behind=True)


def test_counts_add_up_and_the_last_says_whether_more_is_left() -> None:
    first = PurgeCounts(runs=500, events=1500, effects=3, plans=1, batches=1)
    second = PurgeCounts(runs=20, events=60, batches=1)
    total = (first + second).stopped(more=False)
    assert total == PurgeCounts(runs=520, events=1560, effects=3, plans=1, batches=2)
    assert total.describe() == "520 runs (1560 events, 3 effects, 1 plans) in 2 batches"
    assert PurgeCounts(batches=1).describe().endswith("in 1 batch")
    assert total.as_dict()["more"] is False


@pytest.mark.parametrize(
    ("age", "text"),
    [
        (timedelta(days=14), "14 days"),
        (timedelta(days=1), "1 day"),
        (timedelta(hours=36), "36 hours"),
        (timedelta(minutes=90), "90 minutes"),
        (timedelta(seconds=45), "45 seconds"),
        (timedelta(seconds=1.5), "1.5 seconds"),
    ],
)
def test_an_age_is_described_in_its_largest_whole_unit(age: timedelta, text: str) -> None:
    assert describe_age(age) == text
