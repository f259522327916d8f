"""A cancel (issue 48): the deadline of a run and of everything it started pulled in to
now, in one statement whatever the tree's size, read by whoever acts on a run next (the
claim, a renewal, the sweeper). On SQLite and PostgreSQL, with the database's clock."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from celery_deadlines.ledger import operations
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.ledger.sql.rows import NewRun
from celery_deadlines.models import Run, RunEvent, Status
from tests.django.ledger.sql.test_ledger_store import (
    NO_RESERVE,
    TTL,
    claim,
    in_,
    lost,
    new_run,
    row,
    won,
)

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgres"])

__all__ = ["store"]  # fixture

from tests.django.ledger.sql.test_ledger_store import store  # noqa: E402


def child(task_id: str, parent: str, root: str, deadline: datetime | None) -> NewRun:
    return replace(new_run(task_id, deadline=deadline), parent_id=parent, root_id=root)


def tree(store: Store) -> None:
    """checkout -> (reserve -> (ship, notify), pay); and an unrelated run, a sibling's."""
    far = in_(store, 600)
    store.outbox.enqueue(new_run("checkout", deadline=far))
    store.outbox.enqueue(child("reserve", "checkout", "checkout", far))
    store.outbox.enqueue(child("ship", "reserve", "checkout", far))
    store.outbox.enqueue(child("notify", "reserve", "checkout", None))
    store.outbox.enqueue(child("pay", "checkout", "checkout", far))
    store.outbox.enqueue(new_run("other-checkout", deadline=far))


def test_a_cancel_pulls_in_the_deadline_of_the_run_and_of_every_run_down_its_tree(
    store: Store,
) -> None:
    tree(store)
    before = store.database_now()
    assert operations.cancel_run(store, "reserve", reason="bad deploy", by="ops@example") == 3
    after = store.database_now()
    for task_id in ("reserve", "ship", "notify"):
        cancelled = row(store, task_id)
        assert cancelled.deadline is not None
        assert before <= cancelled.deadline <= after, task_id  # now, by the database clock
        assert (cancelled.status, cancelled.reason) == (Status.QUEUED, "cancelled")
        assert cancelled.detail == "cancelled by ops@example: bad deploy"
        event = RunEvent.objects.using(store.using).filter(run__task_id=task_id).last()
        assert event is not None
        assert (event.kind, event.detail) == ("cancel", "cancelled by ops@example: bad deploy")
    # its parent, its sibling and another tree are left as they were
    for task_id in ("checkout", "pay", "other-checkout"):
        assert row(store, task_id).reason == ""
        assert row(store, task_id).deadline > after  # type: ignore[operator]


def test_a_cancel_never_lengthens_a_deadline_and_an_earlier_instant_is_kept(
    store: Store,
) -> None:
    tree(store)
    earlier = in_(store, -5)
    soon = in_(store, -10)
    Run.objects.using(store.using).filter(task_id="ship").update(deadline=soon)
    assert operations.cancel_run(store, "checkout", reason="", by="ops", at=earlier) == 5
    assert row(store, "checkout").deadline == earlier
    assert row(store, "ship").deadline == soon  # already earlier: never lengthened
    assert row(store, "notify").deadline == earlier  # none: now the cancel's
    assert row(store, "ship").detail == "cancelled by ops"


def test_a_finished_run_is_untouched_and_its_cancel_returns_0(store: Store) -> None:
    store.outbox.enqueue(new_run("done", deadline=in_(store, 600)))
    lease = won(claim(store, "done"))
    assert store.runs.finish(lease, "w1:1", Status.SUCCEEDED)
    seen = row(store, "done")
    assert operations.cancel_run(store, "done", reason="too late", by="ops") == 0
    assert operations.cancel_run(store, "never-recorded", reason="", by="ops") == 0
    again = row(store, "done")
    assert (again.status, again.version, again.deadline) == (
        Status.SUCCEEDED,
        seen.version,
        seen.deadline,
    )


def test_a_cancelled_queued_run_is_refused_at_its_claim_as_cancelled(store: Store) -> None:
    tree(store)
    operations.cancel_run(store, "checkout", reason="abandoned", by="shop")
    refused = lost(claim(store, "pay"))
    assert refused.why == "cancelled"
    assert won(claim(store, "other-checkout")).token == 1


def test_a_running_attempt_of_a_cancelled_run_cannot_renew_its_lease(store: Store) -> None:
    tree(store)
    lease = won(claim(store, "ship"))
    assert store.runs.renew(lease, "w1:1", TTL) is not None
    operations.cancel_run(store, "checkout", reason="abandoned", by="shop")
    assert store.runs.renew(lease, "w1:1", TTL) is None


def test_the_sweeper_ends_cancelled_queued_runs_as_cancelled(store: Store) -> None:
    tree(store)
    running = won(claim(store, "ship", reserve=NO_RESERVE))
    operations.cancel_run(store, "checkout", reason="abandoned", by="shop")
    expired = store.sweeps.expire_unclaimed()
    assert sorted(e.task_id for e in expired) == ["checkout", "notify", "pay", "reserve"]
    assert {e.reason for e in expired} == {"cancelled"}
    assert (row(store, "pay").status, row(store, "pay").reason) == (Status.EXPIRED, "cancelled")
    # the running one is its attempt's to end (at its renewal), not the sweeper's
    assert row(store, "ship").status == Status.RUNNING
    assert running.token == row(store, "ship").lease_token
    assert row(store, "other-checkout").status == Status.QUEUED


def queued_tree(store: Store, root: str, size: int) -> None:
    """A root and ``size - 1`` runs under it: a chain of groups, four levels deep."""
    now = store.database_now()
    runs = [Run(task_id=root, task_name="shop.charge", root_id=root, deadline=in_(store, 600))]
    for n in range(1, size):
        parent = root if n < 10 else f"{root}-{n // 10}"
        runs.append(
            Run(task_id=f"{root}-{n}", task_name="shop.charge", root_id=root, parent_id=parent)
        )
    for run in runs:
        run.created_at = run.updated_at = now
    Run.objects.using(store.using).bulk_create(runs, batch_size=500)


def test_cancelling_2000_queued_runs_sends_as_many_statements_as_20(store: Store) -> None:
    queued_tree(store, "small", 20)
    queued_tree(store, "large", 2000)
    connection = connections[store.using]
    with CaptureQueriesContext(connection) as small:
        assert operations.cancel_run(store, "small", reason="", by="ops") == 20
    with CaptureQueriesContext(connection) as large:
        assert operations.cancel_run(store, "large", reason="", by="ops") == 2000
    assert len(small) == len(large) == 1
    assert Run.objects.using(store.using).filter(reason="cancelled").count() == 2020


def test_a_retry_published_before_the_cancel_is_refused_at_its_claim_and_never_runs(
    store: Store,
) -> None:
    tree(store)
    lease = won(claim(store, "pay"))
    assert store.runs.retry(
        lease, "w1:1", retries=1, available_at=in_(store, 5), message_body=b"{}", detail="retry"
    )
    operations.cancel_run(store, "checkout", reason="abandoned", by="shop")
    assert row(store, "pay").status == Status.RETRYING
    assert lost(claim(store, "pay", retries=1)).why == "cancelled"


def test_each_cancel_and_the_runs_it_changed_are_counted_where_it_is_made(store: Store) -> None:
    from prometheus_client import CollectorRegistry

    from celery_deadlines.contrib import prometheus

    registry = CollectorRegistry()
    prometheus.install(registry)
    tree(store)
    operations.cancel_run(store, "reserve", reason="bad deploy", by="ops")
    operations.cancel_run(store, "checkout", reason="abandoned", by="shop")
    assert registry.get_sample_value("celery_deadlines_cancels_total") == 2
    # reserve's three, then checkout's two others (pay, itself): ship, notify and
    # reserve were unended but already cancelled, and are changed again (never later)
    assert registry.get_sample_value("celery_deadlines_runs_cancelled_total") == 3 + 5


def test_explain_says_when_who_why_and_what_was_running_at_the_cancel(store: Store) -> None:
    from celery_deadlines.explain import explanation_of, render_text, utc

    tree(store)
    shipping = won(claim(store, "ship", owner="celery@shop:7"))
    store.effects.record_intent(shipping, "order-1:label", "label", "execution", "f")
    assert store.effects.dispatch(shipping, "order-1:label") == 1
    operations.cancel_run(store, "checkout", reason="customer left: twice", by="ops@example")

    running = explanation_of("ship", using=store.using)
    assert running is not None
    cancelled = running["cancelled"]
    assert cancelled is not None
    cancel_event = RunEvent.objects.using(store.using).get(run__task_id="ship", kind="cancel")
    assert cancelled == {
        "at": cancelled["at"],
        "by": "ops@example",
        "reason": "customer left: twice",
        "status_then": "RUNNING",
        "owner_then": "celery@shop:7",
        "token_then": shipping.token,
        "effects_dispatched_by_then": ["order-1:label"],
        "running_in_its_tree_then": ["ship"],
    }
    assert cancelled["at"] == utc(cancel_event.at)
    answers = {
        line.strip().split("  ", 1)[0]: line.strip().split("  ", 1)[1].strip()
        for line in render_text(running)[1:]
        if line.startswith("  ") and not line.startswith("    ") and "  " in line.strip()
    }
    assert answers["cancelled"] == f"at {cancelled['at']} by ops@example: customer left: twice"
    assert answers["at the cancel"] == (
        f"it was RUNNING (owner celery@shop:7, token {shipping.token}); its effects "
        "dispatched by then: order-1:label; running in its tree then: ship"
    )

    queued = explanation_of("pay", using=store.using)
    assert queued is not None
    assert queued["cancelled"] is not None
    assert (queued["cancelled"]["status_then"], queued["cancelled"]["owner_then"]) == (
        "QUEUED",
        None,
    )
    assert queued["cancelled"]["running_in_its_tree_then"] == ["ship"]
    never = explanation_of("other-checkout", using=store.using)
    assert never is not None
    assert never["cancelled"] is None


@pytest.mark.parametrize("alias", ["default", "postgres"])
def test_a_bodys_queries_are_cut_once_a_cancel_pulls_its_deadline_in(alias: str) -> None:
    from datetime import timedelta

    from celery import Celery

    from celery_deadlines import QueryCut
    from celery_deadlines.clock import get_clock
    from celery_deadlines.core import database
    from celery_deadlines.rules.budgets import Anchor

    app = Celery("cancelled-body", set_as_current=False)
    app.conf.deadlines_database_cap = [alias]
    clock = get_clock()
    now, started = clock.now(), clock.monotonic()
    anchor = Anchor.at(now + timedelta(seconds=600), now, started)
    with database.capped(app, anchor), connections[alias].cursor() as cursor:
        cursor.execute("SELECT 1")  # ten minutes left: in time
        # the renewal learnt the cancel: the deadline is the cancel's instant
        database.pull_in(anchor, Anchor.at(now, now, started))
        with pytest.raises(QueryCut, match="the deadline had passed"):
            cursor.execute("SELECT 2")
