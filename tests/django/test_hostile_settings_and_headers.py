"""Settings and request headers at the limits of what Python holds: ``manage.py check``
reports them (never crashes), and a trusted proxy's header beyond UTC's range is
ignored as malformed (never an HTTP 500)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client, override_settings

from celery_deadlines.checks import check_settings

pytestmark = pytest.mark.usefixtures("clock")


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
