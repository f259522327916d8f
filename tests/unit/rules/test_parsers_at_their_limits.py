"""Every parser at the edges of what Python can hold: only the package's documented
errors leave it (never ``OverflowError``), values that would round to nothing are
refused, and what an error repeats of a value is cut."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from celery_deadlines import InvalidDeadline
from celery_deadlines.conf import BUDGETS, DEFAULT_BUDGET, LEASE_TTL, MAX_BUDGET, Settings
from celery_deadlines.core.options import start_of
from celery_deadlines.errors import ConfigurationError
from celery_deadlines.rules.budgets import LONGEST, capped_seconds, parse_budget, parse_duration
from celery_deadlines.rules.gates import retry_wait
from celery_deadlines.rules.incoming import (
    Unusable,
    header_instant,
    parse_request_budgets,
    parse_rfc3339,
)
from celery_deadlines.rules.quoting import shown
from celery_deadlines.rules.retention import parse_age
from celery_deadlines.rules.stamping import expiry_of, read_headers
from celery_deadlines.rules.wire import decode, decode_occurrence

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
HORIZON = timedelta(days=7)
YEAR_ZERO = "0001-01-01T00:00:00+01:00"  # in UTC, the last hour of the year 0
YEAR_10000 = "9999-12-31T23:59:59-01:00"  # in UTC, the first hour of the year 10000


@pytest.mark.parametrize("value", [YEAR_ZERO, YEAR_10000])
def test_an_rfc3339_header_beyond_utcs_range_is_malformed_not_an_overflow(value: str) -> None:
    with pytest.raises(InvalidDeadline, match="outside the range of a UTC datetime"):
        parse_rfc3339(value)
    found = header_instant("rfc3339", value, now=NOW, horizon=HORIZON)
    assert isinstance(found, Unusable)
    assert found.why == "malformed"


@pytest.mark.parametrize("value", [YEAR_ZERO, YEAR_10000])
def test_an_iso_deadline_header_at_the_date_limits_is_invalid_not_an_overflow(value: str) -> None:
    with pytest.raises(InvalidDeadline, match="outside the range of a UTC datetime"):
        decode(value, now=NOW, horizon=HORIZON)


def test_an_integer_header_too_large_for_a_float_is_invalid_not_an_overflow() -> None:
    with pytest.raises(InvalidDeadline, match="out of range"):
        decode(10**400, now=NOW, horizon=HORIZON)


def test_an_unreadable_header_is_kept_unreadable_whatever_its_size() -> None:
    carried = read_headers({"x_deadline": "9" * 10_000}, NOW, HORIZON, "t-1")
    assert carried.deadline is None
    assert carried.unreadable == "9" * 10_000  # the child is refused for it too


def test_an_occurrence_at_the_date_limits_or_naive_has_no_start_instant() -> None:
    for at in (YEAR_ZERO, YEAR_10000, "2026-12-03T12:00:00"):
        assert decode_occurrence({"at": at, "schedule": "s"})["not_before"] is None
    aware = decode_occurrence({"at": "2026-12-03T13:00:00+01:00"})["not_before"]
    assert aware == NOW
    assert aware.tzinfo == UTC


@pytest.mark.parametrize("value", [1e308, 10**400, timedelta.max, LONGEST + timedelta(days=1)])
def test_a_duration_longer_than_a_century_is_refused_not_an_overflow(value: object) -> None:
    with pytest.raises(InvalidDeadline, match="too long: at most 36525 days"):
        parse_duration(value, name="budget")
    with pytest.raises(InvalidDeadline, match="too long"):
        parse_budget(value, name="budget", maximum=HORIZON)


@pytest.mark.parametrize("value", [1e-300, 1e-9, 4e-7])
def test_a_duration_that_would_round_to_zero_is_refused(value: float) -> None:
    with pytest.raises(InvalidDeadline, match="shorter than a microsecond"):
        parse_duration(value, name="lease")
    with pytest.raises(InvalidDeadline, match="shorter than a microsecond"):
        parse_duration(value, name="reserve", allow_zero=True)  # not zero, and not more


def test_a_microsecond_is_the_shortest_duration() -> None:
    assert parse_duration(1e-6, name="lease") == timedelta(microseconds=1)


def test_request_budgets_with_an_absurd_value_are_refused_not_an_overflow() -> None:
    with pytest.raises(InvalidDeadline, match=r"too long"):
        parse_request_budgets({"/api/*": 1e308}, name="budgets", maximum=HORIZON)


def test_an_age_written_beyond_a_century_is_too_long() -> None:
    with pytest.raises(InvalidDeadline, match="too long"):
        parse_age("P99999999999999D", name="--older-than")
    with pytest.raises(InvalidDeadline, match="shorter than a microsecond"):
        parse_age("0.0000001s", name="--older-than")


@pytest.mark.parametrize("setting", [DEFAULT_BUDGET, MAX_BUDGET, LEASE_TTL])
@pytest.mark.parametrize("value", [1e308, 10**400, 1e-300])
def test_a_setting_at_the_limits_is_a_configuration_error_naming_it(
    setting: object, value: object
) -> None:
    settings = Settings({setting.name: value})  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match=setting.name):  # type: ignore[attr-defined]
        settings.get(setting)  # type: ignore[arg-type]


def test_a_per_task_budget_at_the_limits_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="deadlines_budgets"):
        Settings({BUDGETS.name: {"shop.charge": 1e308}}).get(BUDGETS)


def test_a_countdown_or_expires_beyond_a_century_is_later_than_any_deadline() -> None:
    deadline = NOW + timedelta(seconds=30)
    assert start_of({"countdown": 1e308}, NOW) == NOW + LONGEST
    assert start_of({"countdown": -(10**400)}, NOW) == NOW - LONGEST
    assert expiry_of(1e308, NOW) == NOW + LONGEST > deadline
    assert expiry_of(math.nan, NOW) is None
    assert retry_wait(None, 1e308, None, NOW) == LONGEST


def test_a_countdown_that_is_not_a_number_is_refused_with_a_clear_error() -> None:
    with pytest.raises(InvalidDeadline, match="countdown must be a number of seconds"):
        start_of({"countdown": math.nan}, NOW)
    with pytest.raises(InvalidDeadline, match="countdown must be a number of seconds"):
        retry_wait(None, math.nan, None, NOW)


def test_capped_seconds_keeps_ordinary_values_and_caps_the_rest() -> None:
    assert capped_seconds(2.5) == timedelta(seconds=2.5)
    assert capped_seconds(math.inf) == LONGEST
    assert capped_seconds(math.nan) is None


@pytest.mark.parametrize(
    "value",
    ["x" * 10_000_000, 10**5000, ["x" * 1000] * 1000, {"k" * 500: "v" * 500}],
    ids=["10 MB text", "a 5001-digit int", "a long list", "a dict"],
)
def test_an_error_repeats_at_most_a_bounded_part_of_a_hostile_value(value: object) -> None:
    with pytest.raises(InvalidDeadline) as refused:
        decode(value, now=NOW, horizon=HORIZON)
    assert len(str(refused.value)) < 300
    assert len(shown(value)) <= 83


def test_shown_escapes_what_would_rewrite_a_terminal() -> None:
    assert shown("\x1b[2J\u202eevil") == "'\\x1b[2J\\u202eevil'"


def test_a_null_deadline_header_reads_as_no_header() -> None:
    """As a message without the header: any producer may send one, and the publish hook
    (inherited deadlines) and the ledger (recorded ones) hold what it cannot lengthen."""
    assert read_headers({"x_deadline": None}, NOW, HORIZON, "t-1").deadline is None
    carried = read_headers({"x_deadline": None, "x_delivery_deadline": None}, NOW, HORIZON, "t")
    assert (carried.deadline, carried.unreadable) == (None, None)
