"""A cancel on real workers (issue 48): a root that fanned out into a long-running
watcher and a 20-member group queued behind it, on a worker of one process, cancelled
with everything it started. Redis, PostgreSQL, ``celery worker``; the sink file the
bodies append to is the oracle of what ran."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import TaskRevokedError

import celery_deadlines
from celery_deadlines.models import Effect, Run, RunEvent, Status
from tests.integration.conftest import LEDGER_DB, ended
from tests.integration.test_celery_semantics import task_events
from tests.support.processes import Transport, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("postgres"),
    pytest.mark.django_db(transaction=True, databases=[LEDGER_DB]),
]

MEMBERS = 20
#: the workers' lease (tests.support.ledgerapp: TEST_LEASE_TTL): a renewal comes a third
#: of the way into it, so a running attempt learns of a cancel within one lease
LEASE = 2.0


def lines(sink: Path) -> list[dict[str, Any]]:
    if not sink.exists():
        return []
    return [json.loads(line) for line in sink.read_text().splitlines() if line]


def kinds(sink: Path, key: str) -> list[str]:
    return [line["kind"] for line in lines(sink) if line["key"] == key]


def test_a_cancelled_tree_ends_every_queued_run_revoked_and_the_running_one_sees_no_time_left(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path
) -> None:
    tasks = ledger_client(redis_broker)
    ledger_worker(redis_broker, concurrency=1, TEST_LEASE_TTL=str(LEASE))
    root = tasks.fan_out.apply_async(("tree", MEMBERS), budget=120)
    watcher_id, *member_ids = root.get(timeout=30)
    wait_for(lambda: "start" in kinds(sink, "tree-watch"), 30)
    # the group waits behind the watcher: nothing of it has started
    assert not any(
        line["key"].startswith("tree-") and line["key"] != "tree-watch" for line in lines(sink)
    )

    cancelled_at = time.time()
    # the client's app names the ledger's database (the process's current app may not)
    changed = celery_deadlines.cancel(
        root.id, reason="customer abandoned the checkout", app=tasks.app
    )
    assert changed == MEMBERS + 1  # the watcher and the group; the root had ended

    # the running body sees remaining() reach 0 within a renewal (a lease, and slack)
    wait_for(
        lambda: (
            "child-published" in kinds(sink, "tree-watch")
            or "child-refused" in kinds(sink, "tree-watch")
        ),
        30,
    )
    watch = [line for line in lines(sink) if line["key"] == "tree-watch"]
    assert [line["kind"] for line in watch] == [
        "start",
        "remaining-zero",
        "effect-refused:DispatchRefused",  # no effect is dispatched after the cancel
        "child-refused",
    ]
    assert watch[1]["t"] - cancelled_at <= LEASE + 1.0

    # every queued member is refused at its claim, ended cancelled, told REVOKED
    for member_id in member_ids:
        with pytest.raises(TaskRevokedError):
            tasks.app.AsyncResult(member_id).get(timeout=30)
        run = wait_for(lambda member_id=member_id: ended(member_id), 30)
        assert (run.status, run.reason) == (Status.EXPIRED, "cancelled")
        assert tasks.app.AsyncResult(member_id).state == "REVOKED"
    # nothing of their bodies ran, and no child was published after the cancel
    assert [line["key"] for line in lines(sink)] == ["tree-watch"] * 4
    assert not Run.objects.using(LEDGER_DB).filter(task_id__contains="late-child").exists()

    # the history of each says who cancelled it and why
    events = RunEvent.objects.using(LEDGER_DB).filter(run__task_id=member_ids[0], kind="cancel")
    assert [e.detail for e in events] == [
        "cancelled by celery_deadlines.cancel(): customer abandoned the checkout"
    ]
    # the root had finished: untouched, and a cancel of it now changes nothing
    finished = Run.objects.using(LEDGER_DB).get(task_id=root.id)
    assert (finished.status, finished.reason) == (Status.SUCCEEDED, "")
    # the running one ends cancelled too, whatever its body returned, told REVOKED
    watched = wait_for(lambda: ended(watcher_id), 30)
    assert (watched.status, watched.reason) == (Status.EXPIRED, "cancelled")
    with pytest.raises(TaskRevokedError):
        tasks.app.AsyncResult(watcher_id).get(timeout=30)
    assert celery_deadlines.cancel(root.id, reason="again", app=tasks.app) == 0


def provider_calls(log: Path) -> list[dict[str, Any]]:
    return lines(log)


def ended_at(task_id: str) -> Any:
    """The database clock's instant at which the run of ``task_id`` reached its end."""
    return (
        RunEvent.objects.using(LEDGER_DB)
        .filter(run__task_id=task_id, outcome="applied", status__in=[Status.EXPIRED])
        .order_by("id")
        .values_list("at", flat=True)
        .first()
    )


def revoked_events(events: list[dict[str, Any]], task_id: str) -> list[dict[str, Any]]:
    return [e for e in events if e["uuid"] == task_id and e["type"] == "task-revoked"]


#: the lease of the workers below: a renewal a third of the way into it
TREE_LEASE = 3.0


def test_a_cancelled_checkout_tree_ends_every_descendant_within_a_renewal_and_a_lease(
    redis_broker: Transport,
    ledger_client: Any,
    ledger_worker: Any,
    sink: Path,
    provider: tuple[str, Path],
) -> None:
    """The issue's scenario: a root that paid (a provider call), then fanned out into a
    long-running watcher, a chain and a 20-member group of provider calls queued behind
    the watcher on a busy worker of one process (task events on), cancelled mid-way."""
    url, calls = provider
    tasks = ledger_client(redis_broker)
    ledger_worker(
        redis_broker,
        concurrency=1,
        worker_args=("-E",),
        TEST_LEASE_TTL=str(TREE_LEASE),
        TEST_SINK_URL=url,
    )
    with task_events(tasks.app) as events:
        root = tasks.checkout_tree.apply_async(("shop", MEMBERS), budget=120)
        started = root.get(timeout=30)
        watcher_id, chain_ids, member_ids = started["watcher"], started["chain"], started["group"]
        wait_for(lambda: "start" in kinds(sink, "shop-watch"), 30)
        # the chain and the group wait behind the watcher: nothing of them has started
        assert [line["key"] for line in lines(sink)] == ["shop-watch"]

        cancelled_at = time.time()
        changed = celery_deadlines.cancel(root.id, reason="customer left", app=tasks.app)
        # the watcher, the chain's first link (its second is published by the first's
        # end), the group; the root had ended
        assert changed == 1 + 1 + MEMBERS
        cancel = RunEvent.objects.using(LEDGER_DB).get(run__task_id=watcher_id, kind="cancel")

        # the long-running body saw remaining() reach 0, had its query cut, was refused
        # its provider call and its child
        wait_for(lambda: "child-refused" in kinds(sink, "shop-watch"), 30)
        assert kinds(sink, "shop-watch") == [
            "start",
            "remaining-zero",
            "query-cut",
            "pay-refused:DispatchRefused",
            "child-refused",
        ]
        descendants = [watcher_id, chain_ids[0], *member_ids]
        for task_id in descendants:
            with pytest.raises(TaskRevokedError):
                tasks.app.AsyncResult(task_id).get(timeout=30)
            run = wait_for(lambda task_id=task_id: ended(task_id), 30)
            assert (run.status, run.reason) == (Status.EXPIRED, "cancelled"), task_id
            # within one renewal interval and the lease of the cancel, by the ledger's clock
            assert (ended_at(task_id) - cancel.at).total_seconds() <= TREE_LEASE / 3 + TREE_LEASE
        # every one announced as Celery announces a revoked task (Flower shows REVOKED)
        wait_for(lambda: all(revoked_events(events, t) for t in descendants), 30)
    for task_id in descendants:
        assert [(e["expired"], e["terminated"]) for e in revoked_events(events, task_id)] == [
            (False, False)
        ], task_id
    # the chain's second link was never published, nothing of the queued bodies ran, and
    # the provider was called once, by the root, before the cancel: no effect after it
    assert tasks.app.AsyncResult(chain_ids[1]).state == "PENDING"
    assert not Run.objects.using(LEDGER_DB).filter(task_id=chain_ids[1]).exists()
    assert [line["key"] for line in lines(sink)] == ["shop-watch"] * 5
    assert [(c["key"], c["t"] < cancelled_at) for c in provider_calls(calls)] == [
        ("shop-reserve", True)
    ]
    assert not Run.objects.using(LEDGER_DB).filter(task_id__contains="late-child").exists()
    # the finished root is untouched
    finished = Run.objects.using(LEDGER_DB).get(task_id=root.id)
    assert (finished.status, finished.reason) == (Status.SUCCEEDED, "")


@pytest.mark.parametrize(
    ("pool", "acks_late"),
    [("prefork", False), ("threads", False), ("solo", False), ("prefork", True)],
)
def test_a_cancel_terminates_the_body_of_a_task_that_declares_it_and_revokes_its_queue(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path, provider: Any,
    pool: str, acks_late: bool,
) -> None:  # fmt: skip
    """``cancel_terminates = True``: a body that never looks at ``remaining()`` stops at
    the renewal that learns of the cancel; the runs queued behind it are refused at their
    claims (the sweeper is off) and announced revoked. Late-acked, nothing is redelivered:
    the terminated body's message is acknowledged as a refused one is."""
    url, _ = provider
    tasks = ledger_client(redis_broker)
    ledger_worker(
        redis_broker,
        concurrency=1,
        pool=pool,
        worker_args=("-E",),
        TEST_LEASE_TTL=str(LEASE),
        TEST_RECONCILE_INTERVAL="600",
        TEST_SINK_URL=url,
        TEST_ACKS_LATE="1" if acks_late else "0",
    )
    with task_events(tasks.app) as events:
        root = tasks.busy_tree.apply_async(("busy", 3), budget=120)
        started = root.get(timeout=30)
        busy_id, queued_ids = started["busy"], started["queued"]
        wait_for(lambda: "start" in kinds(sink, "busy-busy"), 30)

        cancelled_at = time.time()
        assert celery_deadlines.cancel(root.id, reason="bad deploy", app=tasks.app) == 4

        wait_for(lambda: len(kinds(sink, "busy-busy")) == 2, 30)
        stopped = [line for line in lines(sink) if line["key"] == "busy-busy"]
        assert [line["kind"] for line in stopped] == ["start", "terminated:TerminatedByCancel"]
        assert stopped[1]["t"] - cancelled_at <= LEASE  # at the renewal: a third of a lease
        run = wait_for(lambda: ended(busy_id), 30)
        assert (run.status, run.reason) == (Status.EXPIRED, "cancelled")
        for task_id in [busy_id, *queued_ids]:
            with pytest.raises(TaskRevokedError):
                tasks.app.AsyncResult(task_id).get(timeout=30)
            queued = wait_for(lambda task_id=task_id: ended(task_id), 30)
            assert (queued.status, queued.reason) == (Status.EXPIRED, "cancelled")
        wait_for(lambda: all(revoked_events(events, t) for t in [busy_id, *queued_ids]), 30)
    assert [e["terminated"] for e in revoked_events(events, busy_id)] == [True]
    for task_id in queued_ids:
        assert [e["terminated"] for e in revoked_events(events, task_id)] == [False]
    assert [line["key"] for line in lines(sink)] == ["busy-busy"] * 2  # nothing queued ran


def test_a_cancel_terminates_a_body_after_the_effect_it_is_dispatching_never_within(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path, provider: Any
) -> None:
    url, calls = provider
    tasks = ledger_client(redis_broker)
    ledger_worker(redis_broker, concurrency=1, TEST_LEASE_TTL=str(LEASE), TEST_SINK_URL=url)
    result = tasks.terminable_in_effect.apply_async(("in-effect",), budget=120)
    wait_for(lambda: "dispatching" in kinds(sink, "in-effect"), 30)
    assert celery_deadlines.cancel(result.id, reason="bad deploy", app=tasks.app) == 1

    wait_for(lambda: any(k.startswith("terminated") for k in kinds(sink, "in-effect")), 30)
    # the dispatch that had begun went through to its outcome; the body went no further
    assert kinds(sink, "in-effect") == [
        "start",
        "dispatching",
        "called",
        "terminated:TerminatedByCancel",
    ]
    assert [c["key"] for c in provider_calls(calls)] == ["in-effect"]
    with pytest.raises(TaskRevokedError):
        result.get(timeout=30)
    run = wait_for(lambda: ended(result.id), 30)
    assert (run.status, run.reason) == (Status.EXPIRED, "cancelled")
    assert [(e.key, e.state) for e in Effect.objects.using(LEDGER_DB).filter(run=run)] == [
        ("in-effect", "SUCCEEDED")
    ]


#: how long the body below (l.never_looks) would work if nothing stopped it
STUBBORN_SECONDS = 60.0


@pytest.mark.parametrize(
    ("pool", "acks_late"),
    [("prefork", False), ("prefork", True), ("gevent", False), ("eventlet", False)],
)
def test_a_cancelled_body_that_never_returns_is_ended_when_its_hard_limit_falls_to_one_lease(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path,
    pool: str, acks_late: bool,
) -> None:  # fmt: skip
    """A body that never looks at ``remaining()``, of a task that does not declare
    ``cancel_terminates``: its hard limit (the deadline's cap, 120 s) falls, at the
    cancel, to one lease; the pool ends it then as at any hard limit, long before the
    body's own end, and its run ends ``cancelled``, its caller told ``REVOKED``."""
    tasks = ledger_client(redis_broker)
    ledger_worker(
        redis_broker,
        concurrency=1,
        pool=pool,
        worker_args=("-E",),
        TEST_LEASE_TTL=str(LEASE),
        TEST_RECONCILE_INTERVAL="600",  # the run is ended by its worker, not the sweeper
        TEST_ACKS_LATE="1" if acks_late else "0",
    )
    with task_events(tasks.app) as events:
        result = tasks.never_looks.apply_async(("stubborn", STUBBORN_SECONDS), budget=120)
        wait_for(lambda: "start" in kinds(sink, "stubborn"), 30)
        assert celery_deadlines.cancel(result.id, reason="runaway", app=tasks.app) == 1

        with pytest.raises(TaskRevokedError):
            result.get(timeout=STUBBORN_SECONDS / 2)
        run = wait_for(lambda: ended(result.id), 30)
        assert (run.status, run.reason) == (Status.EXPIRED, "cancelled")
        assert "its hard time limit fell" in run.detail
        wait_for(lambda: revoked_events(events, result.id), 30)
    assert [e["terminated"] for e in revoked_events(events, result.id)] == [True]
    # ended within the bound, a renewal and the lease it can no longer renew (and
    # a second's slack), by the database's clock: not at its own minute's end
    cancel_at = RunEvent.objects.using(LEDGER_DB).get(run=run, kind="cancel").at
    assert (ended_at(result.id) - cancel_at).total_seconds() <= LEASE + LEASE / 3 + 1.0
    assert "gave-up" not in kinds(sink, "stubborn")
    if pool != "prefork":  # a green pool's Timeout is raised in the body
        assert kinds(sink, "stubborn") == ["start", "stopped:Timeout"]
