"""Settings and request headers at the limits of what Python holds: ``manage.py check``
reports them (never crashes, and repeats a bounded part of each), and a trusted proxy's
header beyond UTC's range is ignored as malformed (never an HTTP 500)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.checks import CheckMessage
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client, override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_deadlines import checks as ours
from celery_deadlines.checks import check_settings
from celery_deadlines.conf import SETTINGS
from tests.unit.rules.test_fuzz_parsers import BIG, LONGEST_MESSAGE, Unreadable, hostile, values

pytestmark = pytest.mark.usefixtures("clock", "json_support_known")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CELERY_DEADLINES_DEFAULT_BUDGET", 1e308),
        ("CELERY_DEADLINES_MAX_BUDGET", 10**400),
        ("CELERY_DEADLINES_BUDGETS", {"shop.charge": 1e308}),
        ("CELERY_DEADLINES_REQUEST_BUDGETS", {"/api/*": 1e308}),
        ("CELERY_DEADLINES_LEASE_TTL", 1e-9),
        ("CELERY_DEADLINES_DEFAULT_RESERVE", 1e-300),
        ("CELERY_DEADLINES_RETENTION", "P99999999999999D"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_a_setting_at_the_limits_is_a_check_error_naming_it_not_a_crash(
    name: str, value: Any
) -> None:
    with override_settings(**{name: value}):
        found = check_settings(None)
    assert [message.id for message in found] == ["celery_deadlines.E001"]
    assert name in found[0].msg


def our_checks() -> list[CheckMessage]:
    """What every system check of this package says (none may raise), each message
    and hint checked: at most :data:`LONGEST_MESSAGE` characters."""
    found = [
        message
        for check in (
            ours.check_settings,
            ours.check_contracts,
            ours.check_declarations,
            ours.check_retention,
            ours.check_ingress,
            ours.check_ledger_database,
        )
        for message in check(None)
    ]
    for message in found:
        assert len(message.msg) <= LONGEST_MESSAGE, (message.id, message.msg[:200])
        assert len(message.hint or "") <= LONGEST_MESSAGE, (message.id, (message.hint or "")[:200])
    return found


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("CELERY_DEADLINES_DATABASE", ["default"], "must name a database alias, got ['default']"),
        ("CELERY_DEADLINES_DATABASE", {"default": 1}, "must name a database alias"),
        ("CELERY_DEADLINES_MAX_LOST_LEASES", 2**70, "from 0 to 2147483647, got 1180591"),
        ("CELERY_DEADLINES_MAX_LOST_LEASES", 2**31, "from 0 to 2147483647, got 2147483648"),
        ("CELERY_DEADLINES_REQUEST_BUDGETS", {"/[": 1}, "['/['] is not a path pattern: its '['"),
        ("CELERY_DEADLINES_REQUEST_BUDGETS", {"/api/[z-a]": 1}, "range backwards"),
        ("CELERY_DEADLINES_BUDGETS", Unreadable(a=1), "cannot be read (RuntimeError)"),
    ],
    ids=["list", "dict", "2**70", "2**31", "unclosed-set", "empty-set", "failing-items"],
)
def test_a_setting_the_code_cannot_use_is_an_error_naming_it_and_the_checks_run_on(
    name: str, value: Any, said: str
) -> None:
    with override_settings(**{name: value}):
        found = our_checks()
    errors = [message for message in found if message.id == "celery_deadlines.E001"]
    assert len(errors) == 1
    assert name in errors[0].msg
    assert said in errors[0].msg


@pytest.mark.parametrize(
    ("name", "value", "check"),
    [
        ("CELERY_DEADLINES_BUDGETS", {BIG: 1}, "celery_deadlines.W007"),
        ("CELERY_DEADLINES_REQUEST_HEADERS", {BIG: "rfc3339"}, "celery_deadlines.W005"),
        ("CELERY_DEADLINES_DATABASE", BIG, "celery_deadlines.E003"),
        ("CELERY_DEADLINES_" + "X" * 100_000, 1, "celery_deadlines.E002"),
    ],
    ids=["budgets-key", "request-header", "database", "unknown-name"],
)
def test_a_check_repeats_a_huge_name_cut(name: str, value: Any, check: str) -> None:
    with override_settings(**{name: value}):
        found = [message for message in our_checks() if message.id == check]
    assert len(found) == 1
    assert "xxxxxxxxxx..." in found[0].msg.lower()  # its start, as quoting.shown cuts it


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
@given(st.sampled_from(SETTINGS), st.one_of(values, hostile))
def test_the_checks_answer_any_value_of_any_setting_with_bounded_messages(
    setting: Any, value: object
) -> None:
    with override_settings(**{setting.django_name: value}):
        our_checks()


@pytest.mark.django_db  # model checks may ask the database (JSONField support) first
def test_manage_py_check_reports_an_overflowing_budget() -> None:
    with (
        override_settings(CELERY_DEADLINES_DEFAULT_BUDGET=1e308),
        pytest.raises(SystemCheckError, match=r"CELERY_DEADLINES_DEFAULT_BUDGET.*too long"),
    ):
        call_command("check")


@pytest.fixture
def behind_a_trusted_proxy() -> Iterator[None]:
    with override_settings(
        ROOT_URLCONF="tests.support.ingress_urls",
        MIDDLEWARE=["celery_deadlines.middleware.DeadlineMiddleware"],
        CELERY_DEADLINES_TRUSTED_PROXIES=["127.0.0.0/8"],
        CELERY_DEADLINES_REQUEST_HEADERS={"X-Request-Deadline": "rfc3339"},
    ):
        yield


@pytest.mark.usefixtures("behind_a_trusted_proxy")
@pytest.mark.parametrize("value", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_trusted_header_beyond_utcs_range_is_ignored_and_the_request_succeeds(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="celery_deadlines"):
        response = Client(REMOTE_ADDR="127.0.0.1").get(
            "/budgeted/", headers={"X-Request-Deadline": value}
        )
    assert response.status_code == 200
    assert "ignored (malformed)" in caplog.text
    assert "outside the range of a UTC datetime" in caplog.text
