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
from celery_deadlines.models import Run, RunEvent, Status
from tests.integration.conftest import LEDGER_DB, ended
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
