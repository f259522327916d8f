"""Every admin page renders, for runs in every state, with and without effects, plans
and children: the list, each run's page and history, the effects, and each action's
form. Every instant shown is UTC to the millisecond with its zone."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from celery_deadlines.admin.display import STYLE
from celery_deadlines.explain import utc
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.models import Effect, EffectState, Run, RunPlan, Status
from tests.django.admin.test_runs import record

pytestmark = pytest.mark.django_db(transaction=True)

MILLISECOND_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
#: Django's own date formats: an instant shown in one was not converted by the admin.
LOCAL_FORMATS = re.compile(r"\b(a\.m\.|p\.m\.|midnight|noon)\b")


def effect_for(run: Run, state: EffectState) -> Effect:
    now = Store().database_now()
    return Effect.objects.create(
        key=f"{run.task_id}:pay",
        run=run,
        name="pay",
        state=state,
        lease_token=run.lease_token,
        fingerprint="f" * 64,
        dispatches=1,
        error="TimeoutError('read timed out')" if state == EffectState.UNKNOWN else "",
        created_at=now,
        dispatched_at=now,
        updated_at=now,
    )


@pytest.fixture
def ledger() -> dict[str, Run]:
    """A bare run and a full one (an effect, a plan, a child) in every status; the
    UNKNOWN one's effect is UNKNOWN, the others' succeeded."""
    store = Store()
    now = store.database_now()
    for status in Status:
        for shape in ("bare", "full"):
            task_id = f"{status.value.lower()}-{shape}"
            record(store, task_id, deadline_in=None if status == Status.PAUSED else 600)
            Run.objects.filter(task_id=task_id).update(
                status=status,
                reason="effect_unresolved" if status == Status.UNKNOWN else "",
                owner="celery@shop:7" if status == Status.RUNNING else "",
                lease_expires_at=now + timedelta(seconds=30),
                op="test",
            )
            if shape == "full":
                run = Run.objects.get(task_id=task_id)
                state = EffectState.UNKNOWN if status == Status.UNKNOWN else EffectState.SUCCEEDED
                effect_for(run, state)
                RunPlan.objects.create(
                    run=run, plan_id="p1", document={"steps": ["pay"]}, lease_token=1,
                    created_at=now,
                )  # fmt: skip
                record(store, f"{task_id}-child", parent=task_id)
    return {run.task_id: run for run in Run.objects.all()}


def operator(client: Client) -> User:
    user = User.objects.create_superuser("boss", password="pw")
    client.force_login(user)
    return user


def page(client: Client, url: str, **query: str) -> str:
    response = client.get(url, query)
    assert response.status_code == 200, url
    text = response.content.decode()
    assert not LOCAL_FORMATS.search(text), f"{url} shows an instant in a local format"
    return text


def test_every_run_page_renders_in_every_state_with_and_without_effects_plans_and_children(
    client: Client, ledger: dict[str, Run]
) -> None:
    operator(client)
    listing = page(client, reverse("admin:celery_deadlines_run_changelist"))
    assert "<style>.cdl-badge{" in listing  # the badges' own small stylesheet
    for status in Status:
        assert f">{status.value}</span>" in listing  # its coloured badge
    for task_id, run in ledger.items():
        text = page(client, reverse("admin:celery_deadlines_run_change", args=[run.pk]))
        assert task_id in text
        assert f">{run.status}</span>" in text
        assert "<style>.cdl-badge{" in text
        assert 'id="cdl-sentence"' in text  # the one-sentence explanation
        assert utc(run.created_at) in text
        assert MILLISECOND_UTC.search(text)
        if run.deadline is not None:
            assert utc(run.deadline) in text  # the deadline, to the millisecond
        full = task_id.endswith("-full")
        assert ("Side effects (1," in text) == full
        assert ("Plans (1:" in text) == full
        assert ("Workflow (1 child run(s))" in text) == full
        assert ('<details class="cdl module" open>\n  <summary>Plans' in text) == full
        assert '<div class="readonly">[42]</div>' in text  # args, decoded from the message
        # the operator checklist, answered on the page (docs/howto/explain.md, the operator's
        # questions): owner and lease, claimed version, checkpoint, next side effect,
        # and whether an old worker can still write
        for question in ("owner now", "claimed version", "last checkpoint",
                         "next side effect", "old worker guard"):  # fmt: skip
            assert f"<label>{question}</label>" in text
        history = reverse("admin:celery_deadlines_run_history", args=[run.pk])
        page(client, history)


def test_the_run_page_says_time_left_by_the_database_clock_and_how_long_an_ended_run_ran(
    client: Client, ledger: dict[str, Run]
) -> None:
    operator(client)
    queued = page(
        client, reverse("admin:celery_deadlines_run_change", args=[ledger["queued-bare"].pk])
    )
    assert re.search(r"\d+\.\d min left", queued)
    assert "Summary (by the database clock, " in queued
    done = page(
        client, reverse("admin:celery_deadlines_run_change", args=[ledger["succeeded-bare"].pk])
    )
    assert "<label>time left</label> ended " in done
    paused = page(
        client, reverse("admin:celery_deadlines_run_change", args=[ledger["paused-bare"].pk])
    )
    assert "<label>time left</label> no deadline" in paused


def test_a_resolve_button_sits_beside_an_unknown_effect_and_opens_the_resolve_form(
    client: Client, ledger: dict[str, Run]
) -> None:
    operator(client)
    run = ledger["unknown-full"]
    effect = Effect.objects.get(run=run)
    text = page(client, reverse("admin:celery_deadlines_run_change", args=[run.pk]))
    assert f'<button type="submit" form="cdl-resolve-{effect.pk}"' in text
    assert f'<form id="cdl-resolve-{effect.pk}" method="post"' in text
    settled = page(
        client, reverse("admin:celery_deadlines_run_change", args=[ledger["succeeded-full"].pk])
    )
    assert "cdl-resolve-" not in settled  # none beside a settled effect
    form = client.post(
        reverse("admin:celery_deadlines_effect_changelist"),
        {"action": "resolve", "_selected_action": [effect.pk]},
    )
    assert form.status_code == 200
    body = form.content.decode()
    assert "unknown-full:pay" in body
    assert '<div class="breadcrumbs">' in body
    assert "&rsaquo; Resolve" in body


def test_no_resolve_button_without_the_permission_to_resolve(
    client: Client, ledger: dict[str, Run]
) -> None:
    from tests.django.admin.test_runs import login

    login(client, "view_effect")
    run = ledger["unknown-full"]
    text = page(client, reverse("admin:celery_deadlines_run_change", args=[run.pk]))
    assert "unknown-full:pay" in text
    assert "cdl-resolve-" not in text


def test_the_effect_pages_render_with_instants_in_utc_to_the_millisecond(
    client: Client, ledger: dict[str, Run]
) -> None:
    operator(client)
    listing = page(client, reverse("admin:celery_deadlines_effect_changelist"))
    assert "unknown-full:pay" in listing
    for effect in Effect.objects.all():
        text = page(client, reverse("admin:celery_deadlines_effect_change", args=[effect.pk]))
        assert utc(effect.dispatched_at) in text


def test_an_action_leaves_a_log_entry_the_history_page_shows_in_utc_to_the_millisecond(
    client: Client, ledger: dict[str, Run]
) -> None:
    from django.contrib.admin.models import LogEntry

    operator(client)
    run = ledger["running-bare"]
    client.post(
        reverse("admin:celery_deadlines_run_changelist"),
        {"action": "expire_now", "_selected_action": [run.pk]},
    )
    entry = LogEntry.objects.get(object_id=str(run.pk))
    history = page(client, reverse("admin:celery_deadlines_run_history", args=[run.pk]))
    assert "Expired now (expired_by_operator)" in history
    assert utc(entry.action_time) in history


def test_the_run_list_searches_by_task_name_and_effect_key_and_narrows_by_date(
    client: Client, ledger: dict[str, Run]
) -> None:
    operator(client)
    url = reverse("admin:celery_deadlines_run_changelist")
    by_key = page(client, url, q="failed-full:pay")
    assert "failed-full" in by_key
    assert "queued-full" not in by_key
    assert "queued-bare" in page(client, url, q="charge_card")  # part of the task name
    assert "queued-bare" not in page(client, url, q="refund")
    today = ledger["queued-bare"].created_at
    dated = page(
        client, url, created_at__year=str(today.year), created_at__month=str(today.month),
        created_at__day=str(today.day),
    )  # fmt: skip
    assert "queued-bare" in dated


def test_the_short_id_the_run_list_shows_finds_its_run_in_search(client: Client) -> None:
    operator(client)
    store = Store()
    wanted, other = "3f2a4c1e-0000-4000-8000-000000000001", "9b1d0c77-0000-4000-8000-000000000002"
    for task_id in (wanted, other):
        record(store, task_id)
    url = reverse("admin:celery_deadlines_run_changelist")
    listed = page(client, url)
    short = re.search(rf'<span title="{wanted}">([^<]+)</span>', listed)
    assert short is not None
    assert short[1] == "3f2a4c1e…"
    found = page(client, url, q=short[1])  # as copied from the list, its ellipsis too
    assert wanted in found
    assert other not in found
    assert other in page(client, url, q=" 9b1d0c77 ")


def test_the_lists_wrap_ids_reasons_and_owners_between_words_and_show_a_custom_id_whole(
    client: Client,
) -> None:
    operator(client)
    store = Store()
    record(store, "order-42:capture:v1")  # a custom task id, not Celery's UUID
    Run.objects.filter(task_id="order-42:capture:v1").update(
        status=Status.EXPIRED,
        reason="retry_budget_exhausted",
        owner="celery@warehouse-east-1.example.internal:4242",
    )
    listed = page(client, reverse("admin:celery_deadlines_run_changelist"))
    assert '<span title="order-42:capture:v1">order-<wbr>42:<wbr>capture:<wbr>v1</span>' in listed
    assert "retry_<wbr>budget_<wbr>exhausted" in listed
    assert "celery@<wbr>warehouse-<wbr>east-<wbr>1.<wbr>example.<wbr>internal:<wbr>4242" in listed
    # a list's cells wrap at those breaks only: nothing lets the table squeeze a column
    # into breaking inside a word (retry_budge|t_exhauste|d)
    rules = re.findall(r"(#result_list td[^{]*)\{([^}]*)\}", str(STYLE))
    assert rules
    for selector, declarations in rules:
        assert "anywhere" not in declarations, selector
        assert "break-all" not in declarations, selector


def test_the_effect_list_names_each_run_by_its_short_id_and_status_in_few_columns(
    client: Client, ledger: dict[str, Run]
) -> None:
    operator(client)
    listed = page(client, reverse("admin:celery_deadlines_effect_changelist"))
    for column in ("key_breakable", "name_and_kind", "state_and_updated", "run_link"):
        assert f"column-{column}" in listed
    assert "column-lease_token" not in listed
    assert ">shop.charge_card[unknown-full] UNKNOWN</a>" not in listed  # the run's name
    assert re.search(r'title="shop.charge_card\[unknown-full\]">unknown-<wbr>full</a>', listed)
    assert re.search(r'<span class="cdl-badge"[^>]*>UNKNOWN</span><br>\d{4}-', listed)


def test_the_run_list_filters_by_the_queue_a_run_was_routed_to(
    client: Client, ledger: dict[str, Run]
) -> None:
    operator(client)
    Run.objects.filter(pk=ledger["queued-bare"].pk).update(queue="warehouse", op="test")
    url = reverse("admin:celery_deadlines_run_changelist")
    listing = page(client, url)
    assert "warehouse" in listing  # offered as a filter
    filtered = page(client, url, queue="warehouse")
    assert "queued-bare" in filtered
    assert "failed-full" not in filtered


def test_an_undecodable_message_is_said_and_does_not_fail_the_page(
    client: Client, ledger: dict[str, Run]
) -> None:
    operator(client)
    run = ledger["failed-bare"]
    Run.objects.filter(pk=run.pk).update(message_body=b"\xff\xfe{", op="test")
    text = page(client, reverse("admin:celery_deadlines_run_change", args=[run.pk]))
    said = "stored as &#x27;application/json&#x27;, 3 bytes that do not decode (DecodeError)"
    assert said in text


def test_the_result_stored_by_django_celery_results_is_linked_from_the_run_page(
    client: Client, ledger: dict[str, Run]
) -> None:
    from django_celery_results.models import TaskResult

    operator(client)
    run = ledger["succeeded-bare"]
    stored = TaskResult.objects.create(task_id=run.task_id, status="SUCCESS", result='"charged"')
    text = page(client, reverse("admin:celery_deadlines_run_change", args=[run.pk]))
    link = reverse("admin:django_celery_results_taskresult_change", args=[stored.pk])
    assert f'<a href="{link}">SUCCESS</a>' in text
    assert "charged" in text


def test_a_failed_run_shows_its_error_when_no_result_was_stored(
    client: Client, ledger: dict[str, Run]
) -> None:
    operator(client)
    run = ledger["failed-bare"]
    Run.objects.filter(pk=run.pk).update(reason="error", detail="ProviderDown()", op="test")
    text = page(client, reverse("admin:celery_deadlines_run_change", args=[run.pk]))
    assert '<div class="readonly">ProviderDown()</div>' in text


def test_a_resolution_from_the_run_page_is_in_the_effects_history_in_utc_to_the_millisecond(
    client: Client, ledger: dict[str, Run]
) -> None:
    from django.contrib.admin.models import LogEntry

    from tests.django.admin.test_runs import seen_in

    operator(client)
    effect = Effect.objects.get(run=ledger["unknown-full"])
    url = reverse("admin:celery_deadlines_effect_changelist")
    form = client.post(url, {"action": "resolve", "_selected_action": [effect.pk]})
    client.post(
        url,
        {
            "action": "resolve", "_selected_action": [effect.pk], "apply": "Resolve",
            "found": "yes", "result": '"charged"', "evidence": "provider: charge ch_1",
            **seen_in(form.content.decode()),
        },
    )  # fmt: skip
    effect.refresh_from_db()
    assert effect.state == EffectState.SUCCEEDED
    entry = LogEntry.objects.get(object_id=str(effect.pk))
    history = page(client, reverse("admin:celery_deadlines_effect_history", args=[effect.pk]))
    assert "Resolved as found: provider: charge ch_1" in history
    assert utc(entry.action_time) in history
