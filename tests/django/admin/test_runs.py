"""The operator's admin: runs, their timeline, and two permission-checked actions.

Real data: every run here is written by the ledger's own statements (claims, fenced
writes, a stale holder's refused write), then read through the Django test client.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from celery.signals import before_task_publish
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from celery_deadlines.explain import utc
from celery_deadlines.ledger.outbox import encode_message
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.ledger.sql.rows import Lease, NewRun
from celery_deadlines.models import Run, Status

pytestmark = pytest.mark.django_db(transaction=True)

TTL = timedelta(seconds=30)


def record(store: Store, task_id: str, parent: str = "", deadline_in: float | None = 600) -> None:
    body, content_type, encoding = encode_message("json", [42], {}, {"queue": "shop"})
    deadline = (
        None if deadline_in is None else store.database_now() + timedelta(seconds=deadline_in)
    )
    store.outbox.enqueue(
        NewRun(
            task_id=task_id,
            task_name="shop.charge_card",
            deadline=deadline,
            root_id=parent or task_id,
            parent_id=parent,
            message_body=body,
            content_type=content_type,
            content_encoding=encoding,
        )
    )


def claim(store: Store, task_id: str, owner: str) -> Lease:
    lease = store.runs.claim(
        task_id,
        0,
        task_name="shop.charge_card",
        owner=owner,
        ttl=TTL,
        reserve=timedelta(0),
        max_lost_leases=3,
    )
    assert isinstance(lease, Lease)
    return lease


@pytest.fixture
def story() -> dict[str, Any]:
    """An order that succeeded, a child whose stale holder was fenced, one waiting run."""
    store = Store()
    record(store, "order-42")
    order = claim(store, "order-42", "celery@shop:101")
    record(store, "charge-42", parent="order-42")
    stale = claim(store, "charge-42", "celery@shop:102")
    assert store.runs.checkpoint(stale, "celery@shop:102", "authorised", {"auth": "A-1"})
    assert store.runs.finish(order, "celery@shop:101", Status.SUCCEEDED)
    record(store, "label-42", parent="order-42", deadline_in=None)
    # the charge's lease lapses; another worker takes over; the stale holder is refused
    Run.objects.filter(task_id="charge-42").update(
        lease_expires_at=store.database_now() - timedelta(seconds=2), op="age"
    )
    claim(store, "charge-42", "celery@shop:201")
    assert not store.runs.finish(stale, "celery@shop:102", Status.SUCCEEDED)
    return {"store": store}


def login(client: Client, *permissions: str) -> User:
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="celery_deadlines",
            codename__in=["view_run", "view_runevent", *permissions],
        )
    )
    client.force_login(user)
    return user


def run_list(client: Client, **query: str) -> str:
    response = client.get(reverse("admin:celery_deadlines_run_changelist"), query)
    assert response.status_code == 200
    return response.content.decode()


def test_the_run_list_is_compact_with_a_status_badge_owner_created_and_time_left(
    client: Client, story: dict[str, Any]
) -> None:
    login(client)
    page = run_list(client)
    for expected in ("order-42", "charge-42", "label-42", "celery@<wbr>shop:<wbr>201"):
        assert expected in page  # an owner wraps after its separators
    assert 'class="cdl-badge"' in page
    assert ">SUCCEEDED</span>" in page
    assert ">RUNNING</span>" in page
    assert ">QUEUED</span>" in page
    assert "s left" in page or "min left" in page
    assert "no deadline" in page
    assert "ended after" in page  # how long the succeeded order took
    created = Run.objects.get(task_id="charge-42").created_at
    assert utc(created) in page  # created, in UTC to the millisecond
    assert utc(created).endswith("Z")
    for wide in ("lease_token", "checkpoint_name", "version"):
        assert f"column-{wide}" not in page  # compact: fits a 1,366-pixel screen
    # a long task name wraps after its dots, not in the middle of a word
    assert "shop.<wbr>charge_card" in page


def test_the_run_list_filters_by_status_and_finds_runs_by_root_id(
    client: Client, story: dict[str, Any]
) -> None:
    login(client)
    running = run_list(client, status__exact="RUNNING")
    assert "charge-42" in running
    assert "label-42" not in running
    family = run_list(client, q="order-42")
    assert "charge-42" in family
    assert "label-42" in family


def test_the_run_detail_answers_the_operator_checklist(
    client: Client, story: dict[str, Any]
) -> None:
    login(client)
    charge = Run.objects.get(task_id="charge-42")
    response = client.get(reverse("admin:celery_deadlines_run_change", args=[charge.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    assert "celery@shop:201" in page  # who owns it now
    assert "Lease (who may act on this run now)" in page
    assert "authorised" in page
    assert "A-1" in page
    assert "stale token 1; current token 2 owned by celery@shop:201" in page  # fenced write
    assert "order-42" in page  # its parent, linked
    assert "&quot;queue&quot;: &quot;shop&quot;" in page  # the outbox message
    order = Run.objects.get(task_id="order-42")
    detail = client.get(reverse("admin:celery_deadlines_run_change", args=[order.pk]))
    children = detail.content.decode().split("<summary>Workflow")[1]
    assert "charge-42</a> shop.charge_card" in children  # its children, linked
    assert ">RUNNING</span>" in children  # each with its status


def test_runs_are_read_only_without_the_action_permissions(
    client: Client, story: dict[str, Any]
) -> None:
    login(client)
    page = run_list(client)
    assert "Expire now" not in page
    assert "Requeue" not in page
    charge = Run.objects.get(task_id="charge-42")
    response = client.post(
        reverse("admin:celery_deadlines_run_changelist"),
        {"action": "expire_now", "_selected_action": [charge.pk]},
    )
    assert response.status_code in (200, 302)
    assert Run.objects.get(task_id="charge-42").status == Status.RUNNING
    add = client.get(reverse("admin:celery_deadlines_run_add"))
    assert add.status_code == 403


def test_expire_now_ends_a_running_run_and_fences_its_holder(
    client: Client, story: dict[str, Any]
) -> None:
    login(client, "expire_run")
    charge = Run.objects.get(task_id="charge-42")
    client.post(
        reverse("admin:celery_deadlines_run_changelist"),
        {"action": "expire_now", "_selected_action": [charge.pk]},
    )
    after = Run.objects.get(task_id="charge-42")
    assert (after.status, after.reason) == (Status.EXPIRED, "expired_by_operator")
    assert after.lease_token == charge.lease_token + 1
    assert after.events.last().detail == "expired by operator ops"  # type: ignore[union-attr]


@pytest.fixture
def broker() -> Iterator[list[dict[str, Any]]]:
    """The current Celery app on the in-memory transport; collects what is published."""
    app = Celery("admin-test", broker="memory://", set_as_current=True)
    sent: list[dict[str, Any]] = []

    def collect(headers: dict[str, Any] | None = None, **_: Any) -> None:
        sent.append(dict(headers or {}))

    before_task_publish.connect(collect, weak=False)
    yield sent
    before_task_publish.disconnect(collect)
    app.close()


def test_requeue_publishes_the_recorded_message_again_only_while_the_deadline_allows(
    client: Client, story: dict[str, Any], broker: list[dict[str, Any]]
) -> None:
    store: Store = story["store"]
    login(client, "requeue_run")
    record(store, "late-42", deadline_in=0.001)
    record(store, "failed-42")
    lease = claim(store, "failed-42", "celery@shop:301")
    assert store.runs.finish(lease, "celery@shop:301", Status.FAILED, "error", "ProviderDown()")
    selected = [Run.objects.get(task_id=t).pk for t in ("late-42", "failed-42", "order-42")]
    client.post(
        reverse("admin:celery_deadlines_run_changelist"),
        {"action": "requeue", "_selected_action": selected},
    )
    assert Run.objects.get(task_id="failed-42").status == Status.QUEUED
    assert Run.objects.get(task_id="order-42").status == Status.SUCCEEDED
    assert Run.objects.get(task_id="late-42").status == Status.QUEUED  # untouched
    assert [message["id"] for message in broker] == ["failed-42"]
    assert broker[0]["task"] == "shop.charge_card"


def test_explain_answers_who_owns_the_run_when_its_lease_expires_and_what_was_fenced(
    story: dict[str, Any],
) -> None:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("deadlines", "explain", "charge-42", stdout=out)
    text = out.getvalue()
    charge = Run.objects.get(task_id="charge-42")
    assert "owner now          celery@shop:201" in text
    assert f"fencing token      {charge.lease_token}" in text
    expires = charge.lease_expires_at
    assert expires is not None
    assert f"lease expires      {expires.strftime('%Y-%m-%dT%H:%M:%S')}" in text
    assert "last checkpoint    'authorised'" in text
    assert "under token 1" in text
    assert f"only token {charge.lease_token} may write" in text
    assert "stale writes       1 refused: succeeded by celery@shop:102 (token 1)" in text
    claim = charge.events.filter(kind="claim", lease_token=charge.lease_token).get()
    assert f"claimed version    {claim.version} " in text


def test_explain_and_the_run_page_say_which_task_a_refused_foreign_message_named(
    client: Client,
) -> None:
    from io import StringIO

    from django.core.management import call_command

    store = Store("default")
    record(store, "pay-43")  # a run of shop.charge_card
    forged = store.runs.claim(
        "pay-43", 0, task_name="shop.refund", owner="celery@shop:9", ttl=TTL,
        reserve=timedelta(0), max_lost_leases=3,
    )  # fmt: skip
    assert not isinstance(forged, Lease)
    said = (
        "task_mismatch: a message for task shop.refund carried this run's id; refused "
        "(this is a run of shop.charge_card): nothing of the run changed"
    )
    out = StringIO()
    call_command("deadlines", "explain", "pay-43", stdout=out)
    text = " ".join(out.getvalue().split())  # the history's cells, without the padding
    assert said in text
    assert "stale writes 1 refused: claim by celery@shop:9 (a message for shop.refund)" in text
    out = StringIO()
    call_command("deadlines", "explain", "pay-43", "--json", stdout=out)
    [event] = [e for e in json.loads(out.getvalue())["history"] if e["outcome"] == "rejected"]
    assert (event["kind"], event["detail"]) == ("claim", "task_mismatch:shop.refund")
    login(client)
    run = Run.objects.get(task_id="pay-43")
    page = client.get(reverse("admin:celery_deadlines_run_change", args=[run.pk]))
    assert said.replace("'", "&#x27;") in page.content.decode()


def test_explain_names_a_run_that_does_not_exist() -> None:
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="no run with task id 'nope', nor one starting with it"):
        call_command("deadlines", "explain", "nope")


def test_explain_writes_control_characters_of_ids_and_owners_as_escapes() -> None:
    """An id or an owner is written by whoever published or claimed: the terminal of the
    operator who explains the run must not act on what they contain."""
    from io import StringIO

    from django.core.management import call_command

    store = Store("default")
    hostile = "pay\x1b]0;owned\x07\nstatus  SUCCEEDED\u202e"
    record(store, hostile)
    claim(store, hostile, owner="celery@\x1b[2Jshop")
    out = StringIO()
    call_command("deadlines", "explain", hostile, stdout=out)
    text = out.getvalue()
    assert not {char for char in text if char < " " and char != "\n"}
    assert "\u202e" not in text
    assert "pay\\x1b]0;owned\\x07\\nstatus  SUCCEEDED\\u202e" in text
    assert "celery@\\x1b[2Jshop" in text
    assert not any(line.startswith("status  SUCCEEDED") for line in text.splitlines())


@pytest.fixture
def unknown_payment(story: dict[str, Any]) -> Run:
    """A run whose payment call timed out: effect UNKNOWN, run UNKNOWN (reconcile first)."""
    from celery_deadlines.core.effects import EffectScope
    from celery_deadlines.ledger.attempt import Attempt

    store: Store = story["store"]
    record(store, "pay-42")
    lease = claim(store, "pay-42", "celery@shop:401")
    attempt = Attempt(store, lease, "celery@shop:401", TTL)
    with (
        pytest.raises(TimeoutError),
        EffectScope(attempt, "pay", "order-42:pay", {"a": 1}),
    ):
        raise TimeoutError("provider read timed out")
    assert store.runs.finish(lease, "celery@shop:401", Status.UNKNOWN, "effect_unresolved", "pay")
    return Run.objects.get(task_id="pay-42")


def test_the_run_page_shows_its_effects_in_one_table(client: Client, unknown_payment: Run) -> None:
    login(client, "view_effect")
    page = client.get(
        reverse("admin:celery_deadlines_run_change", args=[unknown_payment.pk])
    ).content.decode()
    assert "Side effects (1, at most once per key)" in page
    assert "order-42:pay" in page
    assert re.search(r'<td><span class="cdl-badge"[^>]*>UNKNOWN</span></td>', page)


def test_an_operator_resolves_an_unknown_effect_with_evidence_and_the_run_is_queued_again(
    client: Client, unknown_payment: Run, broker: list[dict[str, Any]]
) -> None:
    from celery_deadlines.models import Effect, EffectState

    login(client, "view_effect", "resolve_effect")
    effect = Effect.objects.get(key="order-42:pay")
    url = reverse("admin:celery_deadlines_effect_changelist")
    form = client.post(url, {"action": "resolve", "_selected_action": [effect.pk]})
    assert form.status_code == 200
    assert "order-42:pay" in form.content.decode()
    assert "Evidence" in form.content.decode()
    client.post(
        url,
        {
            "action": "resolve", "_selected_action": [effect.pk], "apply": "Resolve",
            "found": "no", "evidence": "provider dashboard: no payment for order 42",
            **seen_in(form.content.decode()),
        },
    )  # fmt: skip
    effect.refresh_from_db()
    assert effect.state == EffectState.NOT_DISPATCHED
    assert effect.evidence == "provider dashboard: no payment for order 42 (operator ops)"
    assert Run.objects.get(task_id="pay-42").status == Status.QUEUED
    assert [message["id"] for message in broker] == ["pay-42"]


def seen_in(page: str) -> dict[str, str]:
    """The hidden ``seen-<pk>`` fields of the resolve form: the dispatch the operator saw."""
    import re

    return dict(re.findall(r'name="(seen-\d+)" value="([^"]+)"', page))


def test_an_operator_resolution_of_a_dispatch_that_moved_on_is_refused_and_said(
    client: Client, unknown_payment: Run, broker: list[dict[str, Any]]
) -> None:
    from celery_deadlines.models import Effect, EffectState

    login(client, "view_effect", "resolve_effect")
    effect = Effect.objects.get(key="order-42:pay")
    url = reverse("admin:celery_deadlines_effect_changelist")
    form = client.post(url, {"action": "resolve", "_selected_action": [effect.pk]})
    seen = seen_in(form.content.decode())
    # meanwhile the reconciler settled it, and a new attempt dispatched it again
    Effect.objects.filter(pk=effect.pk).update(
        state=EffectState.DISPATCHED, dispatches=effect.dispatches + 1, lease_token=9
    )
    Run.objects.filter(task_id="pay-42").update(status=Status.RUNNING, lease_token=9)
    answer = client.post(
        url,
        {
            "action": "resolve", "_selected_action": [effect.pk], "apply": "Resolve",
            "found": "no", "evidence": "provider dashboard: nothing", **seen,
        },
        follow=True,
    )  # fmt: skip
    effect.refresh_from_db()
    assert (effect.state, effect.dispatches) == (EffectState.DISPATCHED, 2)
    page = answer.content.decode()
    assert "0 effect(s) resolved" in page
    assert "changed since dispatch 1" in page
    assert "dispatch 2 (DISPATCHED" in page
    assert broker == []
    rejected = Run.objects.get(task_id="pay-42").events.filter(outcome="rejected").get()
    assert (rejected.kind, rejected.owner) == ("effect_settle", "operator ops")


def test_resolving_needs_its_own_permission(client: Client, unknown_payment: Run) -> None:
    from celery_deadlines.models import Effect, EffectState

    login(client, "view_effect")
    effect = Effect.objects.get(key="order-42:pay")
    client.post(
        reverse("admin:celery_deadlines_effect_changelist"),
        {"action": "resolve", "_selected_action": [effect.pk], "apply": "Resolve",
         "found": "yes", "evidence": "x"},
    )  # fmt: skip
    effect.refresh_from_db()
    assert effect.state == EffectState.UNKNOWN


def test_explain_says_which_effect_is_unknown_and_json_carries_the_same(
    unknown_payment: Run,
) -> None:
    import json
    from io import StringIO

    from django.core.management import call_command

    text = StringIO()
    call_command("deadlines", "explain", "pay-42", stdout=text)
    assert "unknown outcomes   order-42:pay (TimeoutError('provider read timed out'))" in (
        text.getvalue()
    )
    assert "order-42:pay  UNKNOWN" in text.getvalue()
    as_json = StringIO()
    call_command("deadlines", "explain", "pay-42", "--json", stdout=as_json)
    answers = json.loads(as_json.getvalue())
    assert answers["status"] == "UNKNOWN"
    assert [e["key"] for e in answers["unknown_effects"]] == ["order-42:pay"]
    assert answers["writes_allowed_for_token"] is None
