"""Sentry's transaction status of an expected refusal (``celery_deadlines.contrib.sentry``), on a
stand-in for sentry-sdk in ``sys.modules``: which refusals, which status, and what is
never touched. A real worker reported to Sentry: tests/integration/contrib/test_sentry.py."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

from celery_deadlines import DeadlineRefused, DispatchRefused, PlanRefused
from celery_deadlines.contrib.sentry import on_task_failure, status_of
from celery_deadlines.task import EXPECTED


class Span:
    def __init__(self, status: str) -> None:
        self.status = status

    def set_status(self, status: str) -> None:
        self.status = status


def refused(reason: str) -> DeadlineRefused:
    return DeadlineRefused(
        "retry", reason, "2030-01-01T00:00:00+00:00", "2030-01-01T00:00:00+00:00"
    )


@pytest.mark.parametrize(
    ("exception", "status"),
    [
        (refused("retry_budget_exhausted"), "deadline_exceeded"),
        (refused("deadline_passed"), "deadline_exceeded"),
        (refused("invalid_deadline"), "invalid_argument"),
        (DispatchRefused("k", "deadline_passed"), "deadline_exceeded"),
        (DispatchRefused("k", "stale_lease"), "aborted"),
        (DispatchRefused("k", "unresolved"), "failed_precondition"),
        (DispatchRefused("k", "stale_evidence"), "failed_precondition"),
        (PlanRefused("plan_expired"), "failed_precondition"),
    ],
)
def test_each_expected_refusal_has_the_status_that_says_what_happened(
    exception: Exception, status: str
) -> None:
    assert status_of(exception, EXPECTED) == status


def test_an_error_of_the_body_or_a_refusal_the_task_does_not_expect_has_no_status_of_ours() -> None:
    assert status_of(ValueError("boom"), EXPECTED) is None
    assert status_of(refused("deadline_passed"), (ValueError,)) is None  # not in its throws
    assert status_of(refused("deadline_passed"), "not a tuple of classes") is None
    assert status_of(None, EXPECTED) is None


def sentry_with(span: Span | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sentry_sdk", SimpleNamespace(get_current_span=lambda: span))


def task() -> Any:
    return SimpleNamespace(throws=EXPECTED)


def test_a_refusal_replaces_sentrys_internal_error_on_the_current_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    span = Span("internal_error")
    sentry_with(span, monkeypatch)
    on_task_failure(sender=task(), exception=refused("retry_budget_exhausted"))
    assert span.status == "deadline_exceeded"


def test_a_status_the_application_set_and_a_body_error_stay_as_they_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chosen = Span("cancelled")
    sentry_with(chosen, monkeypatch)
    on_task_failure(sender=task(), exception=refused("retry_budget_exhausted"))
    assert chosen.status == "cancelled"
    error = Span("internal_error")
    sentry_with(error, monkeypatch)
    on_task_failure(sender=task(), exception=ValueError("boom"))
    assert error.status == "internal_error"


def test_without_sentry_or_a_span_or_with_a_broken_one_nothing_happens_and_nothing_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "sentry_sdk", raising=False)
    on_task_failure(sender=task(), exception=refused("deadline_passed"))
    sentry_with(None, monkeypatch)
    on_task_failure(sender=task(), exception=refused("deadline_passed"))

    def broken() -> Span:
        raise RuntimeError("a half-initialised SDK")

    monkeypatch.setitem(sys.modules, "sentry_sdk", SimpleNamespace(get_current_span=broken))
    on_task_failure(sender=task(), exception=refused("deadline_passed"))
