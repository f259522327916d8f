"""``manage.py deadlines explain`` and ``reconcile`` for people and for scripts, on SQLite
and PostgreSQL: the text and ``--json`` say the same facts, the text's columns hold, an
ended run never has time left, and neither the command nor a worker's log prints a
dataclass repr.

Every run here is written by the ledger's own statements (claims, effects, a settlement
refused as stale, the sweeper, an operator's expiry), then read through the command.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from celery import Celery
from django.core.management import call_command

from celery_deadlines.explain import Explanation, render_text, utc
from celery_deadlines.ledger.outbox import encode_message
from celery_deadlines.ledger.reconcile import Report, reconcile_once
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.ledger.sql.rows import Lease, NewRun
from celery_deadlines.models import Run, RunEvent, Status
from tests.support.memory_queue import drain

TTL = timedelta(seconds=30)
#: An owner name longer than any column header, to stretch a column.
LONG_OWNER = "celery@warehouse-east-1.example.internal:4242"
INSTANT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def record(
    store: Store,
    task_id: str,
    parent: str = "",
    deadline_in: float | None = 600,
    delivery_in: float | None = None,
) -> int:
    body, content_type, encoding = encode_message("json", [42], {}, {"queue": "q"})
    now = store.database_now()
    store.outbox.enqueue(
        NewRun(
            task_id=task_id,
            task_name="shop.place_order" if not parent else "shop.charge_card",
            deadline=None if deadline_in is None else now + timedelta(seconds=deadline_in),
            delivery_deadline=None if delivery_in is None else now + timedelta(seconds=delivery_in),
            root_id=parent or task_id,
            parent_id=parent,
            message_body=body,
            content_type=content_type,
            content_encoding=encoding,
        )
    )
    return Run.objects.using(store.using).get(task_id=task_id).pk


def claim(store: Store, task_id: str, owner: str, task_name: str = "shop.place_order") -> Lease:
    lease = store.runs.claim(
        task_id,
        0,
        task_name=task_name,
        owner=owner,
        ttl=TTL,
        reserve=timedelta(0),
        max_lost_leases=3,
    )
    assert isinstance(lease, Lease)
    return lease


def version(store: Store, run_id: int) -> int:
    return Run.objects.using(store.using).get(pk=run_id).version


def explain(alias: str, task_id: str, *flags: str) -> str:
    out = StringIO()
    call_command("deadlines", "--database", alias, "explain", task_id, *flags, stdout=out)
    return out.getvalue()


@pytest.fixture
def order(alias: str) -> Store:
    """order-42: republished by the sweeper, claimed, its payment timed out (UNKNOWN),
    settled by an operator (a second, stale settlement refused), released and queued
    again, claimed by another worker that checkpoints, plans and intends a mail; its
    children: one queued, one expired by an operator."""
    store = Store(alias)
    run_id = record(store, "order-42", deadline_in=600, delivery_in=3600)
    assert store.sweeps.mark_republished(run_id, version(store, run_id))
    first = claim(store, "order-42", "celery@shop:101")
    effects = store.effects
    effects.record_intent(first, "order-42:pay", "pay", "execution", "f")
    assert effects.dispatch(first, "order-42:pay") == 1
    assert effects.unknown(first, "order-42:pay", "TimeoutError('read timed out')")
    assert store.runs.finish(first, "celery@shop:101", Status.FAILED, "error", "timeout")
    [seen] = [p for p in effects.pending() if p.task_id == "order-42"]
    assert effects.settle(seen, True, {"paid": 42}, "dashboard: paid", by="operator ops").applied
    assert not effects.settle(seen, False, None, "late look", by="operator two").applied
    released = effects.release_resolved(run_id)
    assert released is not None
    assert (released.status, released.reason) == (Status.QUEUED, "")
    second = claim(store, "order-42", LONG_OWNER)
    assert store.runs.checkpoint(second, LONG_OWNER, "paid", {"payment": "P-1"})
    assert store.plans.save(second, LONG_OWNER, "order-v1", {"steps": ["pay", "mail"]})
    effects.record_intent(second, "order-42:mail", "mail", "delivery", "g")
    record(store, "charge-42", parent="order-42")
    label = record(store, "label-42", parent="order-42")
    assert store.operator.expire_now(label, "operator ops") is not None
    return store


def test_explain_json_has_every_fact_the_text_has(
    alias: str, order: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = order.database_now()  # one reading for both commands: the same answers
    monkeypatch.setattr(Store, "database_now", lambda self: now)
    text = explain(alias, "order-42")
    answers = json.loads(explain(alias, "order-42", "--json"))
    # the text is made from the JSON alone: it cannot show a fact the JSON lacks
    assert text == "\n".join(render_text(answers)) + "\n"
    assert set(INSTANT.findall(text)) <= set(INSTANT.findall(json.dumps(answers)))
    run = Run.objects.using(alias).get(task_id="order-42")
    events = list(run.events.using(alias).order_by("id"))
    history = answers["history"]
    assert [(e["kind"], e["outcome"], e["token"]) for e in history] == [
        (e.kind, e.outcome, e.lease_token) for e in events
    ]
    assert {"effect_intent_recorded", "effect_unknown", "effect_succeeded"} <= {
        e["kind"] for e in history
    }
    [refused] = [e for e in history if e["outcome"] == RunEvent.Outcome.REJECTED]
    assert (refused["kind"], refused["owner"]) == ("effect_settle", "operator two")
    assert answers["stale_writes_refused"][0]["detail"] == refused["detail"]
    for event in history:  # each row of the history table, with its instant
        assert event["at"] in text
        assert event["kind"] in text
    assert [(c["task_id"], c["status"], c["reason"]) for c in answers["children"]] == [
        ("charge-42", "QUEUED", ""),
        ("label-42", "EXPIRED", "expired_by_operator"),
    ]
    assert [(r["kind"], r["status"]) for r in answers["replays"]] == [
        ("republish", "QUEUED"),
        ("reconciled", "QUEUED"),
    ]
    assert "the reconciler: its effects were resolved" in text
    assert [(e["key"], e["state"], e["evidence"]) for e in answers["effects"]] == [
        ("order-42:pay", "SUCCEEDED", "dashboard: paid"),
        ("order-42:mail", "INTENT_RECORDED", None),
    ]
    assert answers["next_effect"] == {"key": "order-42:mail", "state": "planned"}
    assert [(p["plan_id"], p["state"]) for p in answers["plans"]] == [("order-v1", "ACTIVE")]
    assert answers["deadline"] == utc(run.deadline)
    assert answers["delivery_deadline"] == utc(run.delivery_deadline)
    assert answers["deadline"] in text
    assert answers["delivery_deadline"] in text
    assert answers["ended"] is None
    assert 590 < answers["time_left_seconds"] <= 600  # by the database clock
    assert answers["database_clock"].endswith("Z")
    assert (answers["owner"], answers["writes_allowed_for_token"]) == (LONG_OWNER, 3)
    assert answers["last_checkpoint"]["data"] == {"payment": "P-1"}


def test_explain_columns_stay_aligned_with_long_event_names(alias: str, order: Store) -> None:
    lines = explain(alias, "order-42").splitlines()
    [start] = [i for i, line in enumerate(lines) if line.startswith("  history, ")]
    header, *rows = lines[start + 1 :]
    assert any("effect_intent_recorded" in row for row in rows)  # 22 characters
    assert any(LONG_OWNER in row for row in rows)
    for column in ("kind", "outcome", "status", "reason", "version", "token", "owner"):
        offset = header.index(f"  {column}") + 2
        for row in rows:  # every cell starts where its header does, after a gap
            assert row[offset - 2 : offset] == "  ", (column, row)
            assert row[offset] != " ", (column, row)
    # the answers above the tables line up too, whatever the longest label
    answers = lines[1 : lines.index("")]
    values = {len(line) - len(line[2:].split("  ", 1)[1].lstrip()) for line in answers}
    assert len(values) == 1


def test_the_howto_names_every_key_of_explain_json() -> None:
    page = Path(__file__).parents[4] / "docs" / "howto" / "explain.md"
    howto = page.read_text()
    assert howto.startswith("# Answer the operator's questions about a run\n")
    table = [line for line in howto.split("\n## ")[0].splitlines() if line.startswith("| `")]
    named = set(re.findall(r"`([a-z_]+)`", "\n".join(row.split(" | ")[0] for row in table)))
    assert named == set(Explanation.__required_keys__)


@pytest.mark.parametrize("how", ["expired_by_operator", "deadline_passed", "succeeded"])
def test_an_expired_run_is_never_said_to_have_time_left(alias: str, how: str) -> None:
    store = Store(alias)
    run_id = record(store, "r-1", deadline_in=600)
    if how == "expired_by_operator":  # 600 s of its deadline were left when it ended
        claim(store, "r-1", "celery@shop:1")
        assert store.operator.expire_now(run_id, "operator ops") is not None
    elif how == "deadline_passed":  # the sweeper finds it past its deadline, unclaimed
        Run.objects.using(alias).filter(pk=run_id).update(
            deadline=store.database_now() - timedelta(seconds=1), op="age"
        )
        assert [e.task_id for e in store.sweeps.expire_unclaimed()] == ["r-1"]
    else:
        lease = claim(store, "r-1", "celery@shop:1")
        assert store.runs.finish(lease, "celery@shop:1", Status.SUCCEEDED)
    text = explain(alias, "r-1")
    answers = json.loads(explain(alias, "r-1", "--json"))
    assert re.search(r"\bleft\b", text) is None, text
    assert answers["time_left_seconds"] is None
    ended = answers["ended"]
    ending = next(e for e in answers["history"] if e["status"] in ("EXPIRED", "SUCCEEDED"))
    assert ended["at"] == ending["at"]  # when it ended, by the database clock
    assert f"  ended              {ended['at']}: " in text
    if how == "deadline_passed":
        assert "never claimed" in text
        assert ended["ran_seconds"] is None
        assert ended["before_deadline_seconds"] < 0
        assert "after its deadline" in text
    else:
        assert ended["ran_seconds"] >= 0
        assert "(time running)" in text
        assert 590 < ended["before_deadline_seconds"] <= 600
        assert "before its deadline" in text
    assert "(final)" in answers["next_step"]


def test_an_unknown_run_says_what_resolves_it(alias: str) -> None:
    store = Store(alias)
    record(store, "u-1")
    lease = claim(store, "u-1", "celery@shop:1")
    store.effects.record_intent(lease, "u-1:pay", "pay", "execution", "f")
    assert store.effects.dispatch(lease, "u-1:pay") == 1
    assert store.runs.finish(lease, "celery@shop:1", Status.SUCCEEDED)  # ends UNKNOWN
    text = explain(alias, "u-1")
    assert "  status             UNKNOWN (effect_unresolved)" in text
    assert "  next step          an answer for u-1:pay: the task's effect reconciler" in text
    assert "Resolve an unknown outcome" in text
    assert re.search(r"  time left          \d+\.\d s .*by the database clock", text)


@pytest.fixture
def app() -> Iterator[Celery]:
    """The current app, on the in-memory transport (the reconciler publishes)."""
    app = Celery("console-test", broker="memory://", backend="cache+memory://")
    app.conf.update(deadlines_republish_after=60, task_default_queue="q")
    app.set_current()
    drain(app, "q")
    yield app
    app.close()


def sweepable(store: Store, *, late: list[str], forgotten: list[str]) -> None:
    """Runs the next reconcile pass expires (``late``) and republishes (``forgotten``)."""
    for task_id in late + forgotten:
        record(store, task_id)
    past = store.database_now() - timedelta(seconds=61)
    runs = Run.objects.using(store.using)
    runs.filter(task_id__in=late).update(deadline=past, op="age")
    runs.filter(task_id__in=forgotten).update(published_at=past, op="age")


def test_reconcile_prints_readable_lines_and_json(alias: str, app: Celery) -> None:
    store = Store(alias)
    sweepable(store, late=["late-1", "late-2"], forgotten=["forgotten-1"])
    out = StringIO()
    call_command("deadlines", "--database", alias, "reconcile", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines == [
        "expired           2: late-1, late-2",
        "marked unknown    0",
        "failed            0",
        "requeued          0",
        "republished       1: forgotten-1",
        "effects resolved  0",
    ]
    sweepable(store, late=["late-3"], forgotten=["forgotten-2", "forgotten-3"])
    out = StringIO()
    call_command("deadlines", "--database", alias, "reconcile", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {
        "expired": ["late-3"],
        "unknown": [],
        "failed": [],
        "requeued": [],
        "republished": ["forgotten-2", "forgotten-3"],
        "resolved": [],
    }


def test_the_reconcilers_log_line_is_not_a_dataclass_repr(
    alias: str, app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(alias)
    sweepable(store, late=["late-1"], forgotten=["forgotten-1"])
    with caplog.at_level(logging.INFO, logger="celery_deadlines"):
        reconcile_once(app, store)
    [line] = [r.getMessage() for r in caplog.records if "reconciled" in r.getMessage()]
    assert line == "reconciled the run ledger: expired 1: late-1; republished 1: forgotten-1"
    many = Report(expired=[f"run-{i}" for i in range(25)], resolved=["k:1"])
    said = str(many)
    assert "Report(" not in said
    assert "[" not in said
    assert said.startswith("expired 25: run-0, run-1, ")
    assert said.endswith("run-19 and 5 more; effects resolved 1: k:1")
    assert str(Report()) == "nothing to do"


@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_the_commands_read_the_ledger_database_the_setting_names() -> None:
    from django.test import override_settings

    from tests.conftest import service_unavailable
    from tests.support.processes import reachable

    if not reachable("127.0.0.1", 5432):
        service_unavailable("PostgreSQL 127.0.0.1:5432")
    record(Store("postgres"), "elsewhere-1")  # the ledger lives on another alias
    with override_settings(CELERY_DEADLINES_DATABASE="postgres"):
        out = StringIO()
        call_command("deadlines", "explain", "elsewhere-1", "--json", stdout=out)
    assert json.loads(out.getvalue())["task_id"] == "elsewhere-1"


def test_explain_takes_the_short_id_the_admin_lists_and_says_which_runs_share_one(
    alias: str,
) -> None:
    from django.core.management import CommandError

    store = Store(alias)
    for task_id in (
        "3f2a4c1e-0000-4000-8000-000000000001",
        "3f2a4c1e-0000-4000-8000-000000000002",
        "9b1d0c77-0000-4000-8000-000000000003",
        "order-4",
        "order-42",
    ):
        record(store, task_id)
    assert explain(alias, "9b1d0c77…").startswith("run 9b1d0c77-0000-4000-8000-000000000003 (")
    assert explain(alias, "9b1d").startswith("run 9b1d0c77-0000-4000-8000-000000000003 (")
    with pytest.raises(CommandError) as shared:
        explain(alias, "3f2a4c1e…")
    assert str(shared.value) == (
        "'3f2a4c1e…' is not unique: the task ids of 3f2a4c1e-0000-4000-8000-000000000001, "
        "3f2a4c1e-0000-4000-8000-000000000002 start with it; give more of the id"
    )
    # a whole id is that run's, though it starts another's
    assert explain(alias, "order-4").startswith("run order-4 (")
    with pytest.raises(CommandError, match="no run with task id 'x9', nor one starting with it"):
        explain(alias, "x9")
