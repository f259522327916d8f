"""How each database's timestamps are read back: aware UTC instants, whatever came."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from celery_deadlines.ledger.sql.dialect import POSTGRESQL, SQLITE

AT = datetime(2026, 12, 2, 5, 30, tzinfo=UTC)


def test_an_instant_already_in_utc_is_returned_as_it_is() -> None:
    assert POSTGRESQL.instant(AT) is AT


@pytest.mark.parametrize(
    "value",
    [
        AT.astimezone(ZoneInfo("Etc/UTC")),
        AT.astimezone(ZoneInfo("Europe/Paris")),
        AT.astimezone(timezone(timedelta(hours=-5))),
    ],
    ids=["Etc/UTC", "Europe/Paris", "-05:00"],
)
def test_an_aware_instant_in_another_zone_is_the_same_instant_in_utc(value: datetime) -> None:
    read = POSTGRESQL.instant(value)
    assert read == AT
    assert read is not None
    assert read.tzinfo is UTC


def test_sqlites_naive_text_is_read_as_utc() -> None:
    read = SQLITE.instant("2026-12-02 05:30:00")
    assert read == AT
    assert read is not None
    assert read.tzinfo is UTC


def test_no_timestamp_is_none_and_text_that_is_not_one_is_refused() -> None:
    assert POSTGRESQL.instant(None) is None
    with pytest.raises(ValueError, match="not a timestamp"):
        SQLITE.instant("tomorrow")
