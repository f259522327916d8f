"""The rules of a call to another service (pure): the headers that say the deadline, the
outbound gate, and the call's timeout. What the headers say is read back with the
receiving side's own rules (rules/incoming.py): one deadline on both sides."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from celery_deadlines.rules.gates import Gate, Reason
from celery_deadlines.rules.incoming import (
    decide,
    parse_grpc_timeout,
    parse_honoured,
    parse_milliseconds,
    parse_rfc3339,
)
from celery_deadlines.rules.outgoing import (
    DEFAULT_HEADERS,
    LEAST,
    admit,
    call_for,
    cap,
    format_grpc_timeout,
    format_milliseconds,
    format_rfc3339,
    headers,
    unreadable,
)

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
HORIZON = timedelta(days=7)
RESERVE = timedelta(milliseconds=100)


# -- the three syntaxes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("span", "value"),
    [
        (timedelta(microseconds=1), "1u"),
        (timedelta(seconds=12, microseconds=345_678), "12345678u"),
        (timedelta(seconds=99, microseconds=999_999), "99999999u"),
        (timedelta(seconds=100), "100000m"),  # 9 digits of microseconds: milliseconds
        (timedelta(seconds=100, microseconds=999), "100000m"),  # rounded down
        (timedelta(seconds=99_999, microseconds=999_999), "99999999m"),
        (timedelta(seconds=100_000), "100000S"),
        (timedelta(days=2), "172800S"),
        (timedelta(days=7), "604800S"),
        (timedelta(days=3650), "5256000M"),
        (timedelta(0), "0u"),
        (timedelta(seconds=-3), "0u"),  # passed: nothing left, never a negative
    ],
)
def test_a_grpc_timeout_is_the_finest_unit_that_fits_eight_digits_rounded_down(
    span: timedelta, value: str
) -> None:
    assert format_grpc_timeout(span) == value
    assert parse_grpc_timeout(value) <= max(span, timedelta(0))


@pytest.mark.parametrize(
    ("span", "value"),
    [
        (timedelta(milliseconds=1500), "1500"),
        (timedelta(microseconds=1_999), "1"),
        (timedelta(microseconds=999), "0"),
        (timedelta(seconds=-1), "0"),
    ],
)
def test_milliseconds_left_are_whole_and_rounded_down(span: timedelta, value: str) -> None:
    assert format_milliseconds(span) == value


def test_an_rfc3339_instant_is_in_utc_to_the_microsecond() -> None:
    berlin = datetime(2030, 1, 1, 12, 0, 0, 250_000, tzinfo=UTC).astimezone(
        ZoneInfo("Europe/Berlin")
    )
    assert format_rfc3339(berlin) == "2030-01-01T12:00:00.250000Z"
    assert parse_rfc3339(format_rfc3339(berlin)) == berlin
    with pytest.raises(ValueError, match="aware"):
        format_rfc3339(datetime(2030, 1, 1))


@given(left=st.timedeltas(min_value=timedelta(0), max_value=HORIZON))
@example(left=timedelta(seconds=99, microseconds=999_999))
@example(left=timedelta(seconds=100))
def test_no_header_ever_names_a_later_instant_than_the_deadline(left: timedelta) -> None:
    """Read back by the receiving side at the same instant, every header names the
    deadline or an instant before it (rounded down), never one after it."""
    deadline = NOW + left
    sent = headers(DEFAULT_HEADERS, deadline=deadline, now=NOW)
    assert parse_rfc3339(sent["x-request-deadline"]) == deadline
    by_grpc = NOW + parse_grpc_timeout(sent["grpc-timeout"])
    assert by_grpc <= deadline
    # the unit is the finest that holds 8 digits: less than a 100,000th is lost
    assert deadline - by_grpc < max(left / 100_000, timedelta(microseconds=1))
    by_ms = NOW + timedelta(milliseconds=parse_milliseconds(sent["x-request-timeout-ms"]))
    assert deadline - timedelta(milliseconds=1) < by_ms <= deadline


def test_the_receiving_side_reads_the_default_headers_as_the_deadline_they_carry() -> None:
    """The default names are the receiving side's: a receiver honouring them (the
    how-to's deadlines_request_headers) that trusts the caller takes this deadline."""
    deadline = NOW + timedelta(seconds=7, microseconds=123_456)
    sent = headers(DEFAULT_HEADERS, deadline=deadline, now=NOW)
    honoured = parse_honoured(
        {
            "grpc-timeout": "grpc-timeout",
            "X-Request-Timeout-Ms": "milliseconds",
            "X-Request-Deadline": "rfc3339",
        },
        name="deadlines_request_headers",
    )
    assert honoured == dict(DEFAULT_HEADERS)
    later = NOW + timedelta(milliseconds=2)  # the request arrived 2 ms later
    received = decide(
        now=later,
        budget=timedelta(seconds=60),
        budget_source="view",
        headers=sent,
        honoured=honoured,
        trusted=True,
        horizon=HORIZON,
    )
    assert received.deadline == deadline
    assert received.source == "header x-request-deadline"


# -- the outbound gate ---------------------------------------------------------------------------


def test_a_call_with_more_than_its_reserve_left_may_start() -> None:
    decision = admit(deadline=NOW + RESERVE * 2, now=NOW, reserve=RESERVE, target="GET api")
    assert decision.allowed
    assert (decision.gate, decision.remaining) == (Gate.OUTBOUND, RESERVE * 2)


@pytest.mark.parametrize(
    ("left", "reason", "detail"),
    [
        (
            RESERVE,
            Reason.INSUFFICIENT_BUDGET,
            "GET api: 0.100 s left, not more than the outbound reserve of 0.100 s; not sent",
        ),
        (
            timedelta(milliseconds=40),
            Reason.INSUFFICIENT_BUDGET,
            "GET api: 0.040 s left, not more than the outbound reserve of 0.100 s; not sent",
        ),
        (timedelta(0), Reason.DEADLINE_PASSED, "GET api: deadline passed 0.000 s ago; not sent"),
        (-timedelta(seconds=2), Reason.DEADLINE_PASSED, "GET api: deadline passed 2.000 s ago"),
    ],
)
def test_a_call_with_no_more_than_its_reserve_left_is_refused(
    left: timedelta, reason: Reason, detail: str
) -> None:
    decision = admit(deadline=NOW + left, now=NOW, reserve=RESERVE, target="GET api")
    assert (decision.gate, decision.reason) == (Gate.OUTBOUND, reason)
    assert decision.detail.startswith(detail)
    refusal = decision.refusal()
    assert (refusal.gate, refusal.reason) == ("outbound", reason.value)


@pytest.mark.parametrize(
    ("pause", "allowed"),
    [
        (timedelta(0), True),
        (timedelta(milliseconds=899), True),  # 1 ms more than the reserve left after it
        (timedelta(milliseconds=900), False),  # the reserve, exactly: a timeout of zero
        (timedelta(hours=6), False),  # a Retry-After far past the deadline
    ],
)
def test_a_retry_whose_pause_would_leave_no_more_than_the_reserve_is_refused_before_it(
    pause: timedelta, allowed: bool
) -> None:
    decision = admit(
        deadline=NOW + timedelta(seconds=1), now=NOW, reserve=RESERVE, target="GET api", pause=pause
    )
    assert decision.allowed is allowed
    assert decision.remaining == timedelta(seconds=1)  # what is left now, when it is judged
    if not allowed:
        assert decision.reason is Reason.INSUFFICIENT_BUDGET
        assert decision.detail == (
            f"GET api: 1.000 s left, less the client's retry pause of "
            f"{pause.total_seconds():.3f} s, not more than the outbound reserve of 0.100 s; "
            "not sent"
        )


def test_a_retry_pause_changes_nothing_for_a_deadline_already_passed() -> None:
    decision = admit(
        deadline=NOW, now=NOW, reserve=RESERVE, target="GET api", pause=timedelta(seconds=1)
    )
    assert decision.reason is Reason.DEADLINE_PASSED


def test_with_no_reserve_only_a_passed_deadline_refuses_a_call() -> None:
    tick = timedelta(microseconds=1)
    assert admit(deadline=NOW + tick, now=NOW, reserve=timedelta(0), target="x").allowed
    assert not admit(deadline=NOW, now=NOW, reserve=timedelta(0), target="x").allowed


def test_a_deadline_that_cannot_be_read_refuses_the_call_and_shows_the_value_cut() -> None:
    decision = unreadable(now=NOW, target="GET api", value="x" * 500)
    assert (decision.gate, decision.reason, decision.deadline) == (
        Gate.OUTBOUND,
        Reason.INVALID_DEADLINE,
        None,
    )
    assert len(decision.detail) < 120


# -- the call and its timeout --------------------------------------------------------------------


def test_an_admitted_call_carries_the_deadline_and_may_take_the_time_left_less_the_reserve() -> (
    None
):
    deadline = NOW + timedelta(seconds=5)
    call = call_for(deadline=deadline, now=NOW, reserve=RESERVE, names=DEFAULT_HEADERS)
    assert call.deadline == deadline
    assert call.timeout == timedelta(seconds=5) - RESERVE
    assert call.headers == {
        "grpc-timeout": "5000000u",
        "x-request-timeout-ms": "5000",
        "x-request-deadline": "2030-01-01T12:00:05.000000Z",
    }


def test_no_header_names_configured_sends_none() -> None:
    deadline = NOW + timedelta(seconds=5)
    assert call_for(deadline=deadline, now=NOW, reserve=RESERVE, names={}).headers == {}


@pytest.mark.parametrize(
    ("own", "left", "expected"),
    [
        (None, timedelta(seconds=3), timedelta(seconds=3)),  # none of its own: the time left
        (60.0, timedelta(seconds=3), timedelta(seconds=3)),  # a longer one is cut
        (1.5, timedelta(seconds=3), timedelta(seconds=1.5)),  # a shorter one is kept
        (5, timedelta(seconds=3), timedelta(seconds=3)),  # an int, as clients take it
        (math.inf, timedelta(seconds=3), timedelta(seconds=3)),
        (math.nan, timedelta(seconds=3), timedelta(seconds=3)),  # NaN: as if none
        (1e300, timedelta(seconds=3), timedelta(seconds=3)),  # beyond a timedelta: cut
        (None, -timedelta(seconds=1), LEAST),  # the time is up: fail at once, never wait
        (0.0, timedelta(seconds=3), LEAST),  # 0 is "do not wait" to some clients
    ],
)
def test_a_phases_timeout_is_the_callers_own_at_most_the_time_left(
    own: float | None, left: timedelta, expected: timedelta
) -> None:
    assert cap(own, left) == expected
