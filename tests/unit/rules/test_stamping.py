"""What a published message carries, as pure rules: own deadlines, inheritance, headers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celery_deadlines.errors import InvalidDeadline
from celery_deadlines.rules import wire
from celery_deadlines.rules.stamping import (
    PROTOCOL_HEADERS,
    Inherited,
    Own,
    carries_deadlines,
    earlier,
    expiry_of,
    own_deadlines,
    read_headers,
    reserved_headers,
    stamp_for,
    write,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
HORIZON = timedelta(days=7)


def seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


def test_call_options_are_taken_out_and_become_the_publishs_own_deadlines() -> None:
    call: dict[str, Any] = {"budget": 30, "delivery_budget": 60, "queue": "q"}
    own = own_deadlines(call, {}, NOW, HORIZON)
    assert own == Own(NOW + seconds(30), "call", NOW + seconds(60))
    assert call == {"queue": "q"}  # Celery never sees them


def test_an_explicit_header_is_the_own_deadline_when_the_call_names_none() -> None:
    headers = {wire.DEADLINE_HEADER: wire.encode(NOW + seconds(5)), wire.SOURCE_HEADER: "scope"}
    assert own_deadlines({}, headers, NOW, HORIZON) == Own(NOW + seconds(5), "scope", None)


def test_a_bad_call_option_is_refused() -> None:
    with pytest.raises(InvalidDeadline, match="not both"):
        own_deadlines({"budget": 5, "deadline": NOW}, {}, NOW, HORIZON)
    with pytest.raises(InvalidDeadline, match="deadlines_max_budget"):
        own_deadlines({"deadline": NOW + HORIZON + seconds(1)}, {}, NOW, HORIZON)


def test_a_child_can_only_shorten_what_it_inherits_and_keeps_the_parents_origin() -> None:
    parent = Inherited(NOW + seconds(10), None, "parent", "root-1")
    stamp = stamp_for(Own(NOW + seconds(60), "call"), parent, now=NOW, expires=None, task_id="c")
    assert stamp.governed.deadline == NOW + seconds(10)
    assert stamp.governed.clamped_from == NOW + seconds(60)
    assert stamp.origin == "root-1"
    assert stamp.expires == NOW + seconds(10)


def test_an_own_deadline_that_is_earlier_wins_and_starts_its_own_origin() -> None:
    parent = Inherited(NOW + seconds(10), NOW + seconds(99), "parent", "root-1")
    own = Own(NOW + seconds(3), "call", NOW + seconds(50))
    stamp = stamp_for(own, parent, now=NOW, expires=60, task_id="child")
    assert (stamp.governed.deadline, stamp.governed.source) == (NOW + seconds(3), "call")
    assert (stamp.delivery, stamp.origin) == (NOW + seconds(50), "child")
    assert stamp.expires == NOW + seconds(3)  # Celery's expires is capped at the deadline


def test_written_headers_read_back_as_what_was_stamped() -> None:
    stamp = stamp_for(
        Own(NOW + seconds(3), "call", NOW + seconds(9)),
        Inherited(),
        now=NOW,
        expires=None,
        task_id="t-1",
    )
    headers: dict[str, Any] = {}
    write(headers, stamp)
    assert headers["expires"] == (NOW + seconds(3)).isoformat()
    carried = read_headers(headers, NOW, HORIZON, "t-1")
    assert (carried.deadline, carried.delivery, carried.origin) == (
        NOW + seconds(3),
        NOW + seconds(9),
        "t-1",
    )


def test_a_message_without_deadline_headers_carries_nothing_but_its_origin() -> None:
    headers = {wire.ORIGIN_HEADER: "root-1"}
    assert not carries_deadlines(headers)
    assert read_headers(headers, NOW, HORIZON, "t-1") == Inherited(origin="root-1")
    assert carries_deadlines({wire.DELIVERY_DEADLINE_HEADER: 1.0})


def test_an_unreadable_deadline_header_is_carried_as_it_is_not_dropped() -> None:
    carried = read_headers({wire.DEADLINE_HEADER: "soon"}, NOW, HORIZON, "t-1")
    assert (carried.deadline, carried.unreadable) == (None, "soon")


@pytest.mark.parametrize(
    ("expires", "read"),
    [
        (5, NOW + seconds(5)),
        (2.5, NOW + seconds(2.5)),
        ((NOW + seconds(5)).isoformat(), NOW + seconds(5)),
        (NOW + seconds(50), NOW + seconds(50)),
        (datetime(2030, 1, 1, 12, 0), None),  # naive: Celery's timezone, Celery's to read
        ("2030-01-01T12:00:00", None),
        ("garbage", None),
        (float("nan"), None),
        (True, None),
        (None, None),
    ],
)
def test_celerys_expires_is_read_as_an_instant_when_it_names_one(
    expires: object, read: datetime | None
) -> None:
    assert expiry_of(expires, NOW) == read


def test_an_earlier_expires_becomes_the_deadline_and_its_origin_is_the_message() -> None:
    parent = Inherited(NOW + seconds(10), None, "parent", "root-1")
    stamp = stamp_for(Own(NOW + seconds(8), "task"), parent, now=NOW, expires=3, task_id="c")
    assert (stamp.governed.deadline, stamp.governed.source) == (NOW + seconds(3), "expires")
    assert (stamp.origin, stamp.expires) == ("c", NOW + seconds(3))
    headers: dict[str, Any] = {}
    write(headers, stamp)
    assert read_headers(headers, NOW, HORIZON, "c").deadline == NOW + seconds(3)
    assert headers[wire.SOURCE_HEADER] == "expires"


@pytest.mark.parametrize("expires", [30, (NOW + seconds(30)).isoformat(), "garbage"])
def test_a_later_or_unreadable_expires_never_extends_the_deadline(expires: object) -> None:
    stamp = stamp_for(
        Own(NOW + seconds(8), "task"), Inherited(), now=NOW, expires=expires, task_id="c"
    )
    assert (stamp.governed.deadline, stamp.governed.source) == (NOW + seconds(8), "task")
    assert stamp.expires == NOW + seconds(8)  # Celery's own check is set to the deadline


def test_expires_makes_no_deadline_where_there_is_none() -> None:
    stamp = stamp_for(Own(), Inherited(), now=NOW, expires=3, task_id="c")
    assert (stamp.governed.deadline, stamp.expires) == (None, None)


def test_the_earlier_of_two_optional_instants_treats_none_as_no_deadline() -> None:
    assert earlier(None, None) is None
    assert earlier(NOW, None) == NOW
    assert earlier(NOW + seconds(1), NOW) == NOW


def test_the_headers_a_publisher_may_not_set_are_named_sorted_and_only_those() -> None:
    headers = {"task": "shop.refund", "id": "run-of-another-task", "tenant": "acme", 7: "x"}
    assert reserved_headers(headers) == ["id", "task"]
    assert reserved_headers({"tenant": "acme", wire.DEADLINE_HEADER: 1.0}) == []
    assert reserved_headers({"ID": "x", "Task": "y"}) == []  # Celery reads "id" and "task"
    assert reserved_headers(None) == reserved_headers({}) == []


def test_every_field_of_celerys_own_message_is_reserved_and_nothing_else() -> None:
    from celery import Celery  # the rule itself imports nothing of Celery's

    app = Celery("protocol", broker="memory://", set_as_current=False)
    message = app.amqp.as_task_v2("run-1", "shop.charge", (1,), {}, countdown=5, expires=60)
    assert set(message.headers) == set(PROTOCOL_HEADERS)
    assert reserved_headers(message.headers) == sorted(message.headers)
    app.close()
