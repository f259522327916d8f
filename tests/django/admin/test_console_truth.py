"""Every page tells the truth about what happened (issue 32): a charge found after its
run's deadline, and the run page an operator needs at 3 a.m. (a failed body's
traceback, when it started and how long it ran, the limits its deadline capped, one
owner, a resolution credited to the operator, the resolve form that keeps what the
operator wrote). Real components: the ledger's own statements, Celery's tracer for a
body, the Django test client for the pages and forms.

Time is judged from recorded instants: "five minutes later" is a history moved five
minutes back, never a sleep.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from celery import Celery
from django.core.management import call_command
from django.db.models import F
from django.test import Client
from django.urls import reverse

from celery_deadlines import DeadlineRefused, DeadlineTask, PerformedPastDeadline
from celery_deadlines.explain import explanation_of
from celery_deadlines.models import Effect, EffectState, Run, RunEvent, Status
from tests.django.admin.test_runs import login, seen_in, story, unknown_payment
from tests.support.trace import execute_next

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["story", "unknown_payment"]  # fixtures

EFFECTS = "admin:celery_deadlines_effect_changelist"


@pytest.fixture
def app() -> Iterator[Celery]:
    """The current app, with a result backend the caller reads."""
    app = Celery("console-truth", broker="memory://", backend="cache+memory://")
    app.backend.forget("pay-42")  # the in-memory cache is the process's: another test's
    yield app
    app.backend.forget("pay-42")
    app.close()


def five_minutes_on(run: Run) -> None:
    """The run's history as if it was written five minutes ago: enqueued, claimed, its
    call timed out and it ended UNKNOWN, all within milliseconds, five minutes before
    the operator looks."""
    back = timedelta(minutes=5)
    RunEvent.objects.filter(run=run).update(at=F("at") - back)
    Run.objects.filter(pk=run.pk).update(
        created_at=F("created_at") - back,
        published_at=F("published_at") - back,
        updated_at=F("updated_at") - back,
        # its deadline passed while it waited for the operator
        deadline=F("updated_at") - back + timedelta(seconds=30),
    )


def resolve(client: Client, effect: Effect, **answer: str) -> Any:
    url = reverse(EFFECTS)
    form = client.post(url, {"action": "resolve", "_selected_action": [effect.pk]})
    return form, client.post(
        url,
        {
            "action": "resolve",
            "_selected_action": [effect.pk],
            "apply": "Resolve",
            **seen_in(form.content.decode()),
            **answer,
        },
        follow=True,
    )


def explain(task_id: str, *flags: str) -> str:
    out = StringIO()
    call_command("deadlines", "explain", task_id, *flags, stdout=out)
    return out.getvalue()


def test_a_charge_found_after_the_deadline_ends_performed_past_deadline_and_every_page_says_so(
    client: Client, unknown_payment: Run, app: Celery
) -> None:
    login(client, "view_effect", "resolve_effect")
    five_minutes_on(unknown_payment)
    before = Run.objects.get(pk=unknown_payment.pk)
    effect = Effect.objects.get(key="order-42:pay")
    form, answer = resolve(
        client, effect, found="yes", evidence="provider dashboard: ch_42", result='"ch_42"'
    )
    # the form warned, before the operator submitted, what resolving would do
    warned = form.content.decode()
    assert "The deadline has passed" in warned
    assert "performed_past_deadline" in warned
    assert "its result is not replayed" in warned
    assert "replayed to the run's next attempt" not in warned

    run = Run.objects.get(pk=unknown_payment.pk)
    assert (run.status, run.reason) == (Status.EXPIRED, "performed_past_deadline")
    assert run.detail.startswith("performed: pay (order-42:pay); ")
    assert "outcome unknown" not in run.detail
    assert run.published_at == before.published_at  # nothing was published

    told = app.AsyncResult("pay-42").result  # the caller
    assert isinstance(told, PerformedPastDeadline)
    assert isinstance(told, DeadlineRefused)
    assert (told.gate, told.reason) == ("release", "performed_past_deadline")
    assert told.deadline_at == run.deadline
    assert "performed: pay (order-42:pay)" in str(told)
    assert "claim gate" not in str(told)
    assert "unreadable" not in str(told)

    said = answer.content.decode()
    assert "run pay-42 expired (performed_past_deadline: the effect is recorded as performed" in (
        said
    )
    page = client.get(reverse("admin:celery_deadlines_run_change", args=[run.pk])).content.decode()
    assert "performed: pay (order-42:pay)" in page
    assert "never claimed" not in page
    facts = explanation_of("pay-42")
    assert facts is not None
    assert facts["ended"] is not None
    claim = run.events.get(kind="claim")
    assert facts["claimed_version"] == claim.version
    assert facts["claimed_token"] == claim.lease_token
    # it ran milliseconds; it waited five minutes for the operator
    stopped = run.events.filter(id__gt=claim.id).exclude(status="RUNNING").order_by("id")[0]
    assert facts["ended"]["ran_seconds"] == round((stopped.at - claim.at).total_seconds(), 3)
    assert facts["ended"]["after_enqueue_seconds"] > 290
    assert "expired after its side effect was performed" in facts["next_step"]
    text = explain("pay-42")
    assert "EXPIRED (performed_past_deadline: performed: pay (order-42:pay)" in text
    assert re.search(r"claimed version    \d+ \(claim at \S+Z under token 1; released since", text)


def test_a_charge_not_found_after_the_deadline_ends_deadline_passed_with_its_deadline_said(
    client: Client, unknown_payment: Run, app: Celery
) -> None:
    login(client, "view_effect", "resolve_effect")
    five_minutes_on(unknown_payment)
    resolve(client, Effect.objects.get(key="order-42:pay"), found="no", evidence="no charge")
    run = Run.objects.get(pk=unknown_payment.pk)
    assert (run.status, run.reason) == (Status.EXPIRED, "deadline_passed")
    assert "not dispatched again" in run.detail
    told = app.AsyncResult("pay-42").result
    assert type(told) is DeadlineRefused
    assert (told.gate, told.reason) == ("release", "deadline_passed")
    assert told.deadline_at == run.deadline
    assert "unreadable" not in str(told)


def test_an_operators_resolution_is_credited_to_the_operator_in_the_history(
    client: Client, unknown_payment: Run, app: Celery
) -> None:
    login(client, "view_effect", "resolve_effect")
    resolve(client, Effect.objects.get(key="order-42:pay"), found="no", evidence="no charge")
    run = Run.objects.get(pk=unknown_payment.pk)
    settled = run.events.get(kind="effect_not_dispatched")
    assert settled.owner == "operator ops"  # not celery@shop:401, whose lease it was
    released = run.events.get(kind="reconciled")
    assert released.detail == "effects resolved by operator ops"
    page = client.get(reverse("admin:celery_deadlines_run_change", args=[run.pk])).content.decode()
    assert re.search(r"effect_not_dispatched.*?</td><td>operator ops</td>", page, re.S)


def test_the_resolve_form_keeps_what_the_operator_wrote_and_says_what_is_missing_beside_it(
    client: Client, unknown_payment: Run
) -> None:
    login(client, "view_effect", "resolve_effect")
    effect = Effect.objects.get(key="order-42:pay")
    _, unanswered = resolve(client, effect, evidence="ticket OPS-7: the bank's reply")
    page = unanswered.content.decode()
    assert unanswered.status_code == 200
    assert "Say whether the provider&#x27;s records show it" in page
    assert re.search(r'<ul class="errorlist[^"]*"[^>]*><li>Say whether', page)
    assert "ticket OPS-7: the bank&#x27;s reply</textarea>" in page
    _, unparsed = resolve(client, effect, found="yes", evidence="ticket OPS-7", result="{ch_42")
    page = unparsed.content.decode()
    assert "The result to replay must be JSON" in page
    assert "ticket OPS-7</textarea>" in page
    assert "{ch_42</textarea>" in page
    assert re.search(r'<input type="radio" name="found" value="yes"[^>]*checked', page)
    _, empty = resolve(client, effect, found="no", evidence="  ")
    assert "Evidence is required" in empty.content.decode()
    assert Effect.objects.get(pk=effect.pk).state == EffectState.UNKNOWN  # nothing resolved


def test_the_run_page_says_one_owner_in_its_summary_and_its_lease_section(
    client: Client, unknown_payment: Run
) -> None:
    login(client)
    page = client.get(
        reverse("admin:celery_deadlines_run_change", args=[unknown_payment.pk])
    ).content.decode()
    said = "nobody (no live lease; last claimed by celery@shop:401)"
    assert page.count(said) == 2, page
    assert '<div class="readonly">celery@shop:401</div>' not in page


def failing_charge(self: DeadlineTask) -> None:
    declined("card 4242")


def declined(card: str) -> None:
    raise ValueError(f"{card} declined by the issuer")


def test_a_failed_runs_page_shows_its_traceback_start_runtime_and_the_limits_its_deadline_capped(
    client: Client,
) -> None:
    app = Celery("console-failing", broker="memory://", backend="cache+memory://")
    app.conf.update(task_default_queue="failing", deadlines_ledger=True)
    task = app.task(
        base=DeadlineTask,
        bind=True,
        name="shop.declined_charge",
        time_limit=30,
        soft_time_limit=24,
        shared=False,
    )(failing_charge)
    try:
        sent = task.apply_async(budget=5)
        state, error = execute_next(app, "failing")
        assert state == "FAILURE"
        assert isinstance(error, ValueError)
        run = Run.objects.get(task_id=sent.id)
        assert (run.status, run.reason) == (Status.FAILED, "error")
        assert run.traceback is not None
        assert run.traceback.startswith("Traceback (most recent call last):")
        assert "in declined" in run.traceback
        assert run.traceback.rstrip().endswith("ValueError: card 4242 declined by the issuer")

        login(client)
        page = client.get(reverse("admin:celery_deadlines_run_change", args=[run.pk]))
        text = page.content.decode()
        assert '<pre class="cdl-traceback">Traceback (most recent call last):' in text
        facts = json.loads(explain(sent.id, "--json"))
        assert facts["traceback"] == run.traceback
        claim = run.events.get(kind="claim")
        assert run.deadline is not None
        left = round((run.deadline - claim.at).total_seconds(), 3)
        [limits] = facts["time_limits"]
        # worked out as the job was handed to the pool, a little before its claim
        hard, soft = limits["hard_seconds"], limits["soft_seconds"]
        assert left <= hard <= 5
        assert (limits["hard_set_by"], limits["hard_celery_seconds"]) == ("deadline", 30)
        assert limits["hard_celery_set_by"] == "task"
        assert soft == pytest.approx(hard * 24 / 30, abs=1e-3)  # its place before the hard
        assert (limits["soft_set_by"], limits["soft_celery_seconds"]) == ("deadline", 24)
        ended = run.events.get(kind="failed").at
        assert facts["runtime_seconds"] == round((ended - claim.at).total_seconds(), 3)
        assert facts["started_at"] == facts["claimed_at"]
        capped = (
            f"hard limit {hard:.3f} s, the deadline's (shorter than the task's own "
            f"time_limit: 30.0 s); soft limit {soft:.3f} s, the deadline's (shorter than "
            "the task's own soft_time_limit: 24.0 s)"
        )
        assert html.escape(capped) in text
        assert capped in explain(sent.id)
        assert f"{facts['runtime_seconds']:.3f} s (time running over 1 attempt(s))" in text
        for label in ("Started (UTC)", "Runtime", "Ended (UTC)", "Time limits"):
            assert f"<label>{label}:</label>" in text
    finally:
        app.close()
