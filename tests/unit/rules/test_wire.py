"""The deadline header parser: what is a deadline, and what is bad input."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_deadlines import InvalidDeadline
from celery_deadlines.rules.wire import decode, encode

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
HORIZON = timedelta(days=7)


def test_encoded_deadline_decodes_to_the_same_instant() -> None:
    deadline = NOW + timedelta(seconds=30.25)
    assert decode(encode(deadline), now=NOW, horizon=HORIZON) == deadline


def test_aware_iso_string_from_another_producer_is_accepted_and_made_utc() -> None:
    decoded = decode("2026-11-29T13:00:30+01:00", now=NOW, horizon=HORIZON)
    assert decoded == NOW + timedelta(seconds=30)
    assert decoded.tzinfo == UTC


def test_deadline_in_the_past_is_a_valid_deadline_not_bad_input() -> None:
    assert decode(encode(NOW) - 60, now=NOW, horizon=HORIZON) == NOW - timedelta(seconds=60)


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("soon", "not a number or ISO-8601"),
        ("2026-11-29T12:00:30", "naive"),
        (math.nan, "not a finite number"),
        (math.inf, "not a finite number"),
        (-math.inf, "not a finite number"),
        (-1.0, "negative"),
        (1e300, "out of range"),
        (True, "type bool"),
        (None, "type NoneType"),
        ([1795989196.6], "type list"),
        ({"at": 1}, "type dict"),
    ],
)
def test_malformed_header_is_refused_with_a_reason(value: object, complaint: str) -> None:
    with pytest.raises(InvalidDeadline, match=complaint):
        decode(value, now=NOW, horizon=HORIZON)


@pytest.mark.parametrize("value", [0.0, -0.0, 0, 1795989196])
def test_the_epoch_itself_and_whole_seconds_are_readable_deadlines(value: float) -> None:
    assert decode(value, now=NOW, horizon=HORIZON) == datetime.fromtimestamp(value, UTC)


def test_the_last_instant_a_datetime_holds_is_read_and_the_next_second_refused() -> None:
    last = datetime.max.replace(tzinfo=UTC, microsecond=0)
    assert decode(last.timestamp(), now=last, horizon=HORIZON) == last
    half = decode(last.timestamp() + 0.5, now=last, horizon=HORIZON)  # read the long way
    assert half == last + timedelta(microseconds=500_000)
    with pytest.raises(InvalidDeadline, match="out of range"):
        decode(last.timestamp() + 1.0, now=NOW, horizon=HORIZON)


def test_deadline_beyond_the_horizon_is_refused_as_absurd() -> None:
    far = encode(NOW + HORIZON + timedelta(seconds=1))
    with pytest.raises(InvalidDeadline, match="more than 7 days"):
        decode(far, now=NOW, horizon=HORIZON)


@given(st.floats(min_value=0, max_value=encode(NOW + HORIZON), allow_nan=False))
def test_any_sane_epoch_round_trips_to_an_aware_utc_instant(value: float) -> None:
    decoded = decode(value, now=NOW, horizon=HORIZON)
    assert decoded.tzinfo == UTC
    assert abs(decoded.timestamp() - value) < 1e-5


@given(
    st.one_of(
        st.text(),
        st.floats(),
        st.integers(),
        st.booleans(),
        st.none(),
        st.lists(st.integers()),
        st.dictionaries(st.text(), st.integers()),
    )
)
def test_parser_either_returns_an_aware_instant_or_raises_invalid_deadline(value: object) -> None:
    """No input crashes the parser with anything but InvalidDeadline, and none means 'none'."""
    try:
        decoded = decode(value, now=NOW, horizon=HORIZON)
    except InvalidDeadline:
        return
    assert decoded.tzinfo is not None
    assert decoded - NOW <= HORIZON
