"""A forged submission to the operator's admin (a number no page writes, a date no
calendar holds, a search longer than any id) answers 400 with a message, or Django's
"wrong lookup", and changes nothing: never a 500. Through Django's test client, with
the ledger on SQLite and on PostgreSQL (where ``bigint`` has a range: 10^23 is out of
it, and SQLite's ``INTEGER`` refuses it too)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.test.utils import override_settings
from django.urls import reverse

from celery_deadlines.core.effects import EffectScope
from celery_deadlines.ledger.attempt import Attempt
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.models import Effect, EffectState, Run, Status
from tests.conftest import service_unavailable
from tests.django.admin.test_runs import TTL, broker, claim, login, record, seen_in
from tests.support.processes import reachable

__all__ = ["broker"]  # a fixture of these tests

#: The issue's number: beyond PostgreSQL's bigint and SQLite's INTEGER.
HUGE = "99999999999999999999999"
#: The longest answer a forged submission gets (what it repeats of the value is cut).
LONGEST_ANSWER = 400


class LedgerOn:
    """Routes the ledger's models to ``alias`` (the admin's users stay on ``default``)."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self.alias if model._meta.app_label == "celery_deadlines" else None

    db_for_write = db_for_read


@pytest.fixture(
    params=[
        pytest.param(
            "default",
            id="sqlite",
            marks=pytest.mark.django_db(transaction=True, databases=["default"]),
        ),
        pytest.param(
            "postgres",
            id="postgresql",
            marks=pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
        ),
    ]
)
def ledger(request: pytest.FixtureRequest) -> Iterator[str]:
    """The alias the admin's pages read the ledger from (the test runs on each)."""
    alias = str(request.param)
    if alias == "postgres" and not reachable("127.0.0.1", 5432):
        service_unavailable("PostgreSQL 127.0.0.1:5432")
    with override_settings(DATABASE_ROUTERS=[LedgerOn(alias)]):
        yield alias


def unknown_payment(alias: str, task_id: str) -> Effect:
    """A run whose payment call timed out: its effect and the run UNKNOWN."""
    store = Store(alias)
    record(store, task_id)
    lease = claim(store, task_id, "celery@shop:401")
    attempt = Attempt(store, lease, "celery@shop:401", TTL)
    with pytest.raises(TimeoutError), EffectScope(attempt, "pay", f"{task_id}:pay", {"a": 1}):
        raise TimeoutError("provider read timed out")
    assert store.runs.finish(lease, "celery@shop:401", Status.UNKNOWN, "effect_unresolved", "pay")
    return Effect.objects.using(alias).get(key=f"{task_id}:pay")


def unchanged(alias: str, *effects: Effect) -> None:
    """Each effect and its run as they were: nothing settled, released or logged."""
    for effect in effects:
        now = Effect.objects.using(alias).get(pk=effect.pk)
        assert (now.state, now.dispatches, now.evidence) == (EffectState.UNKNOWN, 1, None)
        assert Run.objects.using(alias).get(pk=effect.run_id).status == Status.UNKNOWN
    assert not LogEntry.objects.exists()


def said(answer: Any, *words: str) -> str:
    """The 400's message, checked: short, and saying ``words``."""
    assert answer.status_code == 400
    text = str(answer.content.decode())
    assert len(text) <= LONGEST_ANSWER, text[:LONGEST_ANSWER]
    for word in words:
        assert word in text
    return text


EFFECTS = "admin:celery_deadlines_effect_changelist"
RUNS = "admin:celery_deadlines_run_changelist"


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(lambda seen: f"UNKNOWN:1:{HUGE}:1", id="the-issues-token"),
        pytest.param(lambda seen: seen.replace(":1:", f":{HUGE}:", 1), id="dispatches"),
        pytest.param(lambda seen: seen.rsplit(":", 1)[0] + f":{HUGE}", id="run"),
        pytest.param(lambda seen: seen.replace(":1:", ":-1:", 1), id="negative"),
        pytest.param(lambda seen: seen.replace(":1:", f":{2**63}:", 1), id="2**63"),
        pytest.param(lambda seen: seen.replace(":1:", ":\u0661:", 1), id="arabic-digit"),
        pytest.param(lambda seen: seen.replace(":1:", ":1_0:", 1), id="underscore"),
        pytest.param(lambda seen: "X" * 100_000 + seen[7:], id="100k-state"),
        pytest.param(lambda seen: seen + ":1", id="five-parts"),
        pytest.param(lambda seen: "", id="empty"),
    ],
)
def test_a_forged_dispatch_in_the_resolve_form_answers_400_and_resolves_nothing(
    client: Client, ledger: str, broker: list[dict[str, Any]], forge: Any
) -> None:
    login(client, "view_effect", "resolve_effect")
    first, second = unknown_payment(ledger, "pay-1"), unknown_payment(ledger, "pay-2")
    url = reverse(EFFECTS)
    form = client.post(url, {"action": "resolve", "_selected_action": [first.pk, second.pk]})
    seen = seen_in(form.content.decode())
    assert seen[f"seen-{second.pk}"].startswith("UNKNOWN:1:")
    seen[f"seen-{second.pk}"] = forge(seen[f"seen-{second.pk}"])
    for found in ("no", "yes"):  # and a form with an error is not shown again with it
        answer = client.post(
            url,
            {
                "action": "resolve", "_selected_action": [first.pk, second.pk],
                "apply": "Resolve", "found": found, "evidence": "provider: nothing",
                "result": "null", **seen,
            },
        )  # fmt: skip
        said(answer, f"seen-{second.pk} must be the dispatch the form showed", "Nothing")
    incomplete = client.post(
        url,
        {"action": "resolve", "_selected_action": [first.pk, second.pk], "apply": "Resolve",
         "found": "no", "evidence": "", **seen},
    )  # fmt: skip
    said(incomplete, "Nothing was resolved")
    unchanged(ledger, first, second)  # the first's dispatch was named right: not settled either
    assert broker == []


@pytest.mark.parametrize("selected", [HUGE, f"-{HUGE}", "abc", "1e3", " 1", ""])
@pytest.mark.parametrize(
    ("changelist", "action"),
    [(RUNS, "expire_now"), (RUNS, "requeue"), (EFFECTS, "resolve")],
)
def test_a_forged_selection_for_an_action_answers_400_and_does_nothing(
    client: Client,
    ledger: str,
    broker: list[dict[str, Any]],
    changelist: str,
    action: str,
    selected: str,
) -> None:
    login(client, "view_effect", "resolve_effect", "expire_run", "requeue_run")
    effect = unknown_payment(ledger, "pay-1")
    for applied in ({}, {"apply": "Resolve", "found": "no", "evidence": "e"}):
        answer = client.post(
            reverse(changelist),
            {"action": action, "_selected_action": [effect.run_id, selected], **applied},
        )
        said(answer, "A selected row must be named by its id", "Nothing was done")
    unchanged(ledger, effect)
    assert broker == []


@pytest.mark.parametrize(
    "period",
    [
        {"created_at__year": HUGE},
        {"created_at__year": "2026", "created_at__month": HUGE},
        {"created_at__year": "2026", "created_at__month": "1", "created_at__day": HUGE},
        {"created_at__year": "9999"},  # its next year is no date
        {"created_at__year": "9999", "created_at__month": "12", "created_at__day": "31"},
    ],
    ids=["year", "month", "day", "9999", "9999-12-31"],
)
def test_a_date_no_calendar_holds_in_the_run_lists_query_is_a_wrong_lookup(
    client: Client, ledger: str, period: dict[str, str]
) -> None:
    login(client)
    unknown_payment(ledger, "pay-1")
    answer = client.get(reverse(RUNS), period)
    assert (answer.status_code, answer["Location"]) == (302, "/admin/celery_deadlines/run/?e=1")


def test_a_run_created_in_the_last_year_a_date_holds_is_listed_with_its_year(
    client: Client, ledger: str
) -> None:
    """A row written by hand at the end of the calendar: the date hierarchy's probes
    stop there (no year follows it), and drilling into it is a wrong lookup."""
    login(client)
    effect = unknown_payment(ledger, "pay-1")
    last = datetime(9999, 12, 31, 23, 59, tzinfo=UTC)
    Run.objects.using(ledger).filter(pk=effect.run_id).update(created_at=last)
    answer = client.get(reverse(RUNS))
    assert answer.status_code == 200
    assert "pay-1" in answer.content.decode()
    assert "?created_at__year=9999" in answer.content.decode()
    drilled = client.get(reverse(RUNS), {"created_at__year": "9999"})
    assert (drilled.status_code, drilled["Location"]) == (302, "/admin/celery_deadlines/run/?e=1")


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_search_longer_than_any_task_id_finds_nothing_and_fails_nothing(client: Client) -> None:
    """SQLite refuses a ``LIKE`` pattern of 50,000 bytes (PostgreSQL has no such limit)."""
    login(client)
    unknown_payment("default", "pay-1")
    answer = client.get(reverse(RUNS), {"q": "p" * 100_000})
    assert answer.status_code == 200
    assert "pay-1" not in answer.content.decode()
    assert "pay-1" in client.get(reverse(RUNS), {"q": "pay-1"}).content.decode()


def test_a_result_to_replay_nested_deeper_than_json_reads_is_a_form_error(
    client: Client, ledger: str, broker: list[dict[str, Any]]
) -> None:
    login(client, "view_effect", "resolve_effect")
    effect = unknown_payment(ledger, "pay-1")
    url = reverse(EFFECTS)
    form = client.post(url, {"action": "resolve", "_selected_action": [effect.pk]})
    answer = client.post(
        url,
        {"action": "resolve", "_selected_action": [effect.pk], "apply": "Resolve",
         "found": "yes", "evidence": "provider: paid", "result": "[" * 100_000,
         **seen_in(form.content.decode())},
    )  # fmt: skip
    assert answer.status_code == 200
    assert "The result to replay is nested too deep to read." in answer.content.decode()
    unchanged(ledger, effect)
