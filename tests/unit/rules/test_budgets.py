"""Budget parsing, precedence and the clamp rule."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from celery_deadlines import InvalidDeadline
from celery_deadlines.rules.budgets import (
    Anchor,
    govern,
    parse_budget,
    parse_duration,
    parse_instant,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
WEEK = timedelta(days=7)


def test_seconds_and_timedeltas_are_both_durations() -> None:
    assert parse_duration(30, name="budget") == timedelta(seconds=30)
    assert parse_duration(1.5, name="budget") == timedelta(seconds=1.5)
    assert parse_duration(timedelta(minutes=2), name="budget") == timedelta(minutes=2)


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        (-1, "more than zero"),
        (0, "more than zero"),
        (timedelta(seconds=-5), "more than zero"),
        (math.nan, "finite"),
        (math.inf, "finite"),
        (True, "bool"),
        ("30", "str"),
        (None, "NoneType"),
    ],
)
def test_bad_durations_are_refused_with_the_name_of_the_value(
    value: object, complaint: str
) -> None:
    with pytest.raises(InvalidDeadline, match=f"budget .*{complaint}|{complaint}"):
        parse_duration(value, name="budget")


def test_a_zero_reserve_is_allowed_but_a_negative_one_is_not() -> None:
    assert parse_duration(0, name="reserve", allow_zero=True) == timedelta(0)
    with pytest.raises(InvalidDeadline, match="zero or more"):
        parse_duration(-0.1, name="reserve", allow_zero=True)


def test_none_budget_means_no_deadline() -> None:
    assert parse_budget(None, name="budget", maximum=WEEK) is None


def test_absurd_budget_is_refused_and_names_the_setting_that_bounds_it() -> None:
    with pytest.raises(InvalidDeadline, match="deadlines_max_budget"):
        parse_budget(timedelta(days=365), name="budget", maximum=WEEK)


def test_naive_datetime_is_refused() -> None:
    with pytest.raises(InvalidDeadline, match="naive"):
        parse_instant(datetime(2026, 11, 29, 12, 0), name="deadline")


def test_an_earlier_own_deadline_is_kept() -> None:
    governed = govern(NOW + timedelta(seconds=5), "call", NOW + timedelta(seconds=10), "parent")
    assert (governed.deadline, governed.source, governed.clamped_from) == (
        NOW + timedelta(seconds=5),
        "call",
        None,
    )


def test_a_later_own_deadline_is_clamped_to_the_inherited_one_and_says_so() -> None:
    governed = govern(NOW + timedelta(seconds=60), "call", NOW + timedelta(seconds=10), "parent")
    assert governed.deadline == NOW + timedelta(seconds=10)
    assert governed.source == "parent"
    assert governed.clamped_from == NOW + timedelta(seconds=60)


def test_no_own_deadline_inherits() -> None:
    governed = govern(None, None, NOW, "scope")
    assert (governed.deadline, governed.source) == (NOW, "scope")


def test_anchor_measures_remaining_on_the_monotonic_clock_only() -> None:
    anchor = Anchor.at(NOW + timedelta(seconds=10), NOW, monotonic=100.0)
    assert anchor.remaining(103.5) == timedelta(seconds=6.5)
    assert anchor.remaining(112.0) == timedelta(seconds=-2)
