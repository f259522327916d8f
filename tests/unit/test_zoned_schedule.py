"""ZonedSchedule's answers to beat (no side effects; the scheduler records progress)."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

from celery_deadlines.beat import ZonedSchedule
from celery_deadlines.rules.schedules import WEEKDAYS, LocalSchedule
from celery_deadlines.testing import FakeClock, use_clock

DIGEST = LocalSchedule(time(9, 0), "Europe/Berlin", timedelta(minutes=15), WEEKDAYS, "digest")
WEDNESDAY_0900 = datetime(2026, 8, 19, 7, 0, tzinfo=UTC)


def test_before_an_occurrence_beat_is_told_to_wait_until_it() -> None:
    zoned = ZonedSchedule(DIGEST)
    zoned.handled_through = WEDNESDAY_0900 - timedelta(minutes=5)
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=90))):
        due, wait = zoned.is_due(None)
    assert (due, wait) == (False, 90.0)


def test_an_unhandled_occurrence_is_due_and_looked_at_again_soon() -> None:
    zoned = ZonedSchedule(DIGEST)
    zoned.handled_through = WEDNESDAY_0900 - timedelta(minutes=5)
    with use_clock(FakeClock(WEDNESDAY_0900 + timedelta(seconds=1))):
        assert zoned.is_due(None) == (True, 5.0)
        assert zoned.is_due(None) == (True, 5.0)  # asking twice changes nothing


def test_once_handled_the_next_occurrence_is_the_next_weekday() -> None:
    zoned = ZonedSchedule(DIGEST)
    friday = datetime(2026, 8, 21, 7, 0, tzinfo=UTC)
    zoned.handled_through = friday + timedelta(seconds=1)
    with use_clock(FakeClock(friday + timedelta(seconds=2))):
        due, wait = zoned.is_due(None)
    monday = datetime(2026, 8, 24, 7, 0, tzinfo=UTC)  # the weekend is skipped
    assert (due, wait) == (False, (monday - friday - timedelta(seconds=2)).total_seconds())


def test_a_zoned_schedule_survives_beats_state_file() -> None:
    import pickle

    zoned = ZonedSchedule(DIGEST, catch_up=timedelta(days=2))
    assert pickle.loads(pickle.dumps(zoned)) == zoned


def test_after_a_failed_attempt_an_entry_waits_before_it_is_due_again() -> None:
    zoned = ZonedSchedule(DIGEST)
    with use_clock(FakeClock(WEDNESDAY_0900 + timedelta(seconds=1))) as clock:
        zoned.retry_at = clock.now() + timedelta(seconds=5)  # the database was away
        assert zoned.is_due(None) == (False, 5.0)  # beat sleeps instead of spinning
        clock.advance(5)
        assert zoned.is_due(None) == (True, 5.0)
