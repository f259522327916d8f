"""The rules of a request's deadline (pure): the three header syntaxes, trust, the budget
a view gets, and the decision, where a header can only shorten the budget."""

from __future__ import annotations

import ipaddress
import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from celery_deadlines.errors import InvalidDeadline
from celery_deadlines.rules.budgets import UNSET
from celery_deadlines.rules.incoming import (
    SYNTAXES,
    Decision,
    RequestBudgets,
    Syntax,
    choose_budget,
    decide,
    is_trusted,
    parse_grpc_timeout,
    parse_honoured,
    parse_milliseconds,
    parse_networks,
    parse_request_budgets,
    parse_rfc3339,
)

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
HORIZON = timedelta(days=7)
HONOURED: dict[str, Syntax] = {
    "grpc-timeout": "grpc-timeout",
    "x-request-timeout-ms": "milliseconds",
    "x-request-deadline": "rfc3339",
}


def deciding(
    headers: dict[str, str], budget: timedelta | None = timedelta(seconds=10), trusted: bool = True
) -> Decision:
    return decide(
        now=NOW,
        budget=budget,
        budget_source="view",
        headers=headers,
        honoured=HONOURED,
        trusted=trusted,
        horizon=HORIZON,
    )


# -- the syntaxes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1H", timedelta(hours=1)),
        ("2M", timedelta(minutes=2)),
        ("30S", timedelta(seconds=30)),
        ("250m", timedelta(milliseconds=250)),
        ("1500u", timedelta(microseconds=1500)),
        ("2000000n", timedelta(milliseconds=2)),
        ("999n", timedelta(0)),
        ("0S", timedelta(0)),
        ("99999999S", timedelta(seconds=99999999)),
    ],
)
def test_a_grpc_timeout_is_digits_and_a_unit(value: str, expected: timedelta) -> None:
    assert parse_grpc_timeout(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "",
        "5",
        "S",
        "123456789S",
        "5s",
        "5h",
        "-5S",
        "5.5S",
        "5 S",
        "5S5",
        "\uff15S",
        "5S\n",
        "0x5S",
    ],
)
def test_a_grpc_timeout_out_of_its_syntax_is_refused(value: str) -> None:
    with pytest.raises(InvalidDeadline):
        parse_grpc_timeout(value)


def test_milliseconds_are_whole_digits_only() -> None:
    assert parse_milliseconds("1500") == 1500
    for bad in ("", "-1", "1.5", "1e3", "+5", " 5", "\uff11"):
        with pytest.raises(InvalidDeadline):
            parse_milliseconds(bad)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2030-01-01T12:00:05Z", NOW + timedelta(seconds=5)),
        ("2030-01-01t12:00:05z", NOW + timedelta(seconds=5)),
        ("2030-01-01T13:00:05+01:00", NOW + timedelta(seconds=5)),
        ("2030-01-01T12:00:05.25Z", NOW + timedelta(seconds=5.25)),
        ("2030-01-01T12:00:05.123456789Z", NOW + timedelta(seconds=5, microseconds=123456)),
    ],
)
def test_an_rfc3339_instant_is_read_as_utc(value: str, expected: datetime) -> None:
    instant = parse_rfc3339(value)
    assert instant == expected
    assert instant.tzinfo is UTC


@pytest.mark.parametrize(
    "value",
    [
        "2030-01-01T12:00:05",  # naive
        "2030-01-01 12:00:05Z",
        "2030-01-01",
        "20300101T120005Z",
        "2030-02-30T12:00:00Z",
        "2030-01-01T24:00:00Z",
        "2030-12-31T23:59:60Z",
        "1893456005",
        "2030-01-01T12:00:05+0100",
    ],
)
def test_an_rfc3339_instant_without_an_offset_or_out_of_the_syntax_is_refused(value: str) -> None:
    with pytest.raises(InvalidDeadline):
        parse_rfc3339(value)


# -- the decision ----------------------------------------------------------------------------


def test_without_a_header_the_views_budget_governs() -> None:
    decision = deciding({})
    assert decision == Decision(NOW + timedelta(seconds=10), "view")
    assert decision.remaining(NOW + timedelta(seconds=4)) == timedelta(seconds=6)


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("grpc-timeout", "2S"),
        ("x-request-timeout-ms", "2000"),
        ("x-request-deadline", "2030-01-01T12:00:02Z"),
    ],
)
def test_a_trusted_header_shortens_the_views_budget(header: str, value: str) -> None:
    decision = deciding({header: value})
    assert decision.deadline == NOW + timedelta(seconds=2)
    assert decision.source == f"header {header}"
    assert decision.ignored == ()


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("grpc-timeout", "60S"),
        ("x-request-timeout-ms", "10000"),
        ("x-request-deadline", "2030-01-01T12:01:00Z"),
    ],
)
def test_a_header_never_extends_the_views_budget(header: str, value: str) -> None:
    decision = deciding({header: value})
    assert decision.deadline == NOW + timedelta(seconds=10)
    assert decision.source == "view"
    assert [(i.header, i.why) for i in decision.ignored] == [(header, "later")]


def test_a_header_from_an_untrusted_peer_is_not_even_parsed() -> None:
    decision = deciding({"grpc-timeout": "1S", "x-request-deadline": "garbage"}, trusted=False)
    assert decision.deadline == NOW + timedelta(seconds=10)
    assert [i.why for i in decision.ignored] == ["untrusted", "untrusted"]


def test_no_header_makes_a_deadline_where_the_view_has_no_budget() -> None:
    assert deciding({"grpc-timeout": "1S"}, budget=None) == Decision(None, None)


@pytest.mark.parametrize(
    ("header", "value", "why"),
    [
        ("grpc-timeout", "1s", "malformed"),
        ("grpc-timeout", "1S, 2S", "malformed"),  # a repeated header, joined by the server
        ("grpc-timeout", "99999999H", "absurd"),
        ("x-request-timeout-ms", "-5", "malformed"),
        ("x-request-timeout-ms", "9" * 40, "absurd"),
        ("x-request-timeout-ms", "9" * 65, "malformed"),
        ("x-request-deadline", "2030-01-01T12:00:02", "malformed"),
        ("x-request-deadline", "1970-01-01T00:00:00Z", "absurd"),
        ("x-request-deadline", "9999-12-31T23:59:59Z", "absurd"),
        ("x-request-deadline", "now\r\nX-Injected: 1", "malformed"),
    ],
)
def test_a_malformed_or_absurd_header_is_ignored_with_its_reason(
    header: str, value: str, why: str
) -> None:
    decision = deciding({header: value})
    assert decision.deadline == NOW + timedelta(seconds=10)
    assert [(i.header, i.why) for i in decision.ignored] == [(header, why)]
    assert decision.ignored[0].detail


def test_a_long_value_is_shown_cut_in_its_reason() -> None:
    (ignored,) = deciding({"grpc-timeout": "x" * 1000}).ignored
    assert len(ignored.shown) < 50
    assert ignored.shown.endswith("...")


def test_a_deadline_already_past_upstream_is_honoured_as_no_time_left() -> None:
    assert deciding({"grpc-timeout": "0m"}).deadline == NOW
    earlier = deciding({"x-request-deadline": "2030-01-01T11:59:00Z"})
    assert earlier.deadline == NOW - timedelta(minutes=1)
    assert earlier.remaining(NOW) == timedelta(minutes=-1)


def test_the_earliest_usable_header_wins_and_the_others_are_reported() -> None:
    decision = deciding(
        {"grpc-timeout": "5S", "x-request-timeout-ms": "3000", "x-request-deadline": "bad"}
    )
    assert decision.deadline == NOW + timedelta(seconds=3)
    assert decision.source == "header x-request-timeout-ms"
    assert [(i.header, i.why) for i in decision.ignored] == [("x-request-deadline", "malformed")]


def test_a_header_not_in_the_honoured_list_is_not_read() -> None:
    decision = decide(
        now=NOW,
        budget=timedelta(seconds=10),
        budget_source="view",
        headers={"grpc-timeout": "1S"},
        honoured={},
        trusted=True,
        horizon=HORIZON,
    )
    assert decision == Decision(NOW + timedelta(seconds=10), "view")


@given(
    budget=st.timedeltas(min_value=timedelta(milliseconds=1), max_value=HORIZON),
    trusted=st.booleans(),
    values=st.dictionaries(
        st.sampled_from(sorted(HONOURED)),
        st.one_of(
            st.text(max_size=80),
            st.from_regex(r"[0-9]{1,8}[HMSmun]", fullmatch=True),
            st.integers(min_value=0, max_value=10**16).map(str),
            st.datetimes(
                min_value=datetime(1, 1, 2),
                max_value=datetime(9999, 12, 30),
                timezones=st.just(UTC),
            ).map(lambda d: d.isoformat().replace("+00:00", "Z")),
        ),
    ),
)
@example(budget=timedelta(seconds=1), trusted=True, values={"grpc-timeout": "99999999H"})
def test_a_header_can_only_shorten_the_views_budget(
    budget: timedelta, trusted: bool, values: dict[str, str]
) -> None:
    decision = deciding(values, budget=budget, trusted=trusted)
    assert decision.deadline is not None
    assert decision.deadline <= NOW + budget
    assert decision.deadline >= NOW - HORIZON
    ignored = [i.header for i in decision.ignored]
    assert len(ignored) == len(set(ignored))
    assert set(ignored) <= set(values)
    if decision.source != "view":
        assert decision.source is not None
        header = decision.source.removeprefix("header ")
        assert header in values
        assert header not in ignored
    if not trusted:
        assert decision.source == "view"
        assert set(ignored) == set(values)


# -- trust -------------------------------------------------------------------------------------

NETWORKS = parse_networks(["10.0.0.0/8", "192.168.1.7", "fd00::/8"], name="proxies")


@pytest.mark.parametrize(
    ("peer", "trusted"),
    [
        ("10.1.2.3", True),
        ("192.168.1.7", True),
        ("192.168.1.8", False),
        ("fd00::1", True),
        ("fd00::1%eth0", True),
        ("::ffff:10.0.0.1", True),
        ("8.8.8.8", False),
        ("", False),
        (None, False),
        ("unix:/run/app.sock", False),
        ("10.1.2.3:443", False),
    ],
)
def test_only_a_peer_in_a_trusted_network_is_trusted(peer: str | None, trusted: bool) -> None:
    assert is_trusted(peer, NETWORKS) is trusted


def test_no_trusted_network_trusts_no_one() -> None:
    assert not is_trusted("127.0.0.1", ())


@pytest.mark.parametrize("value", ["10.0.0.0/8", ["10.0.0.0/33"], ["not an address"], [10], None])
def test_bad_trusted_networks_are_refused(value: object) -> None:
    with pytest.raises(InvalidDeadline):
        parse_networks(value, name="deadlines_trusted_proxies")


def test_trusted_networks_accept_hosts_and_loose_cidrs() -> None:
    assert parse_networks(("127.0.0.1", "10.1.2.3/8"), name="x") == (
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("10.0.0.0/8"),
    )


# -- the honoured headers and the budgets (settings' values) --------------------------------


def test_honoured_headers_are_named_case_blind_with_a_known_syntax() -> None:
    assert parse_honoured({"Grpc-Timeout": "grpc-timeout"}, name="x") == {
        "grpc-timeout": "grpc-timeout"
    }
    for bad in ({"grpc-timeout": "seconds"}, {"bad header": "rfc3339"}, ["grpc-timeout"]):
        with pytest.raises(InvalidDeadline):
            parse_honoured(bad, name="x")
    assert set(SYNTAXES) == {"grpc-timeout", "milliseconds", "rfc3339"}


def test_request_budgets_split_url_names_from_path_patterns_in_order() -> None:
    budgets = parse_request_budgets(
        {"shop:checkout": 5, "/api/*": 20, "/api/slow/*": 60, "health": None},
        name="x",
        maximum=HORIZON,
    )
    assert budgets.by_name == {"shop:checkout": timedelta(seconds=5), "health": None}
    assert budgets.by_pattern == (
        ("/api/*", timedelta(seconds=20)),
        ("/api/slow/*", timedelta(seconds=60)),
    )
    for bad in ({"x": 0}, {"": 5}, {5: 5}, {"x": timedelta(days=8)}, [("x", 5)]):
        with pytest.raises(InvalidDeadline):
            parse_request_budgets(bad, name="x", maximum=HORIZON)


@pytest.mark.parametrize(
    ("pattern", "fault"),
    [
        ("/[", "its '[' at 1 opens a set of characters no ']' closes"),
        ("/api/[]", "its '[' at 5 opens"),
        ("/a[b]c[!", "its '[' at 6 opens"),
        ("/api/[z-a]/*", "a set of characters in it holds none"),
    ],
)
def test_a_path_pattern_with_a_set_never_closed_or_holding_nothing_is_refused(
    pattern: str, fault: str
) -> None:
    # fnmatch refuses nothing: "/[" would match the path "/[" alone, "[z-a]" no path
    with pytest.raises(InvalidDeadline, match=re.escape(fault)):
        parse_request_budgets({pattern: 5}, name="x", maximum=HORIZON)
    kept = ["/[[]", "/[]]", "/[!]]*", "/api/[a-z]*/", "/(?!)", "/*"]  # sets that close
    budgets = parse_request_budgets(dict.fromkeys(kept, 5), name="x", maximum=HORIZON)
    assert [pattern for pattern, _ in budgets.by_pattern] == kept


BUDGETS = RequestBudgets(
    {"shop:checkout": timedelta(seconds=5), "health": None},
    (("/api/*", timedelta(seconds=20)), ("/api/slow/*", timedelta(seconds=60))),
)


@pytest.mark.parametrize(
    ("view", "view_name", "path", "expected"),
    [
        (timedelta(seconds=1), "shop:checkout", "/api/x", (timedelta(seconds=1), "view")),
        (None, "shop:checkout", "/api/x", (None, "view")),
        (UNSET, "shop:checkout", "/api/x", (timedelta(seconds=5), "URL name shop:checkout")),
        (UNSET, "health", "/api/x", (None, "URL name health")),
        (UNSET, "other", "/api/slow/x", (timedelta(seconds=20), "path pattern /api/*")),
        (UNSET, None, "/API/x", (timedelta(seconds=30), "default request budget")),
        (UNSET, None, "/elsewhere", (timedelta(seconds=30), "default request budget")),
    ],
)
def test_a_requests_budget_is_the_first_level_that_says_anything(
    view: timedelta | None, view_name: str | None, path: str, expected: tuple[object, str]
) -> None:
    chosen = choose_budget(
        view=view,
        view_name=view_name,
        path=path,
        budgets=BUDGETS,
        default=timedelta(seconds=30),
    )
    assert chosen == expected
