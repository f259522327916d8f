"""Whoever ends a run, the same path: an operator's action in the admin tells the caller,
the log and the signals exactly as the reconciler does, and leaves a LogEntry."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse

from celery_deadlines import DeadlineRefused, run_expired
from celery_deadlines.models import Effect, Run, Status
from tests.django.admin.test_runs import login, record, seen_in, story, unknown_payment
from tests.support.signals import received

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["story", "unknown_payment"]  # fixtures


@pytest.fixture
def app() -> Iterator[Celery]:
    """The current app, with a result backend the caller reads."""
    app = Celery("admin-ops", broker="memory://", backend="cache+memory://", set_as_current=True)
    app.backend.forget("pay-42")  # the in-memory cache is the process's: another test's
    yield app
    app.backend.forget("pay-42")
    app.close()


def test_expire_now_tells_the_caller_the_log_and_the_signal_and_leaves_a_log_entry(
    client: Client, story: dict[str, Any], app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    login(client, "expire_run")
    run = Run.objects.get(task_id="charge-42")
    with received(run_expired) as expired:
        client.post(
            reverse("admin:celery_deadlines_run_changelist"),
            {"action": "expire_now", "_selected_action": [run.pk]},
        )
    assert Run.objects.get(pk=run.pk).status == Status.EXPIRED
    refusal = app.AsyncResult("charge-42").result
    assert isinstance(refusal, DeadlineRefused)
    assert (refusal.gate, refusal.reason) == ("operator", "expired_by_operator")
    assert [e["reason"] for e in expired] == ["expired_by_operator"]
    assert "charge-42] EXPIRED (expired_by_operator)" in caplog.text
    entry = LogEntry.objects.get(object_id=str(run.pk))
    assert "Expired now" in entry.get_change_message()


def test_an_effect_resolved_after_the_deadline_ends_the_run_for_the_caller_too(
    client: Client, unknown_payment: Run, app: Celery
) -> None:
    login(client, "view_effect", "resolve_effect")
    Run.objects.filter(pk=unknown_payment.pk).update(
        deadline=unknown_payment.created_at - timedelta(seconds=1)
    )
    effect = Effect.objects.get(key="order-42:pay")
    url = reverse("admin:celery_deadlines_effect_changelist")
    form = client.post(url, {"action": "resolve", "_selected_action": [effect.pk]})
    with received(run_expired) as expired:
        answer = client.post(
            url,
            {
                "action": "resolve",
                "_selected_action": [effect.pk],
                "apply": "Resolve",
                "found": "no",
                "evidence": "provider dashboard: no charge for order 42",
                **seen_in(form.content.decode()),
            },
            follow=True,
        )
    run = Run.objects.get(pk=unknown_payment.pk)
    assert (run.status, run.reason) == (Status.EXPIRED, "deadline_passed")
    refusal = app.AsyncResult("pay-42").result  # the caller is not left PENDING
    assert isinstance(refusal, DeadlineRefused)
    assert refusal.reason == "deadline_passed"
    assert [e["task_id"] for e in expired] == ["pay-42"]
    assert "run pay-42 expired (deadline_passed" in answer.content.decode()
    assert LogEntry.objects.filter(object_id=str(effect.pk)).exists()


def test_requeue_leaves_a_log_entry(client: Client, story: dict[str, Any], app: Celery) -> None:
    login(client, "requeue_run")
    record(story["store"], "failed-42")
    run = Run.objects.get(task_id="failed-42")
    Run.objects.filter(pk=run.pk).update(status=Status.FAILED, reason="error")
    client.post(
        reverse("admin:celery_deadlines_run_changelist"),
        {"action": "requeue", "_selected_action": [run.pk]},
    )
    assert Run.objects.get(pk=run.pk).status == Status.QUEUED
    assert "Requeued" in LogEntry.objects.get(object_id=str(run.pk)).get_change_message()
