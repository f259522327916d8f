"""A success's result survives its worker (issue 31, item 3), with real prefork workers.

A pool process is SIGKILLed right after the run's completion committed SUCCEEDED and
before Celery stored the result (the crash point ``run.completed``): the caller waiting
on ``get()`` receives the real return value, which the completion write kept, whether
the lost worker's message is acknowledged (Celery would store ``WorkerLostError`` over
the success) or redelivered (its claim finds the run ended and would store nothing). A
whole worker killed there, its message acknowledged on receipt, leaves no delivery to
tell the caller: the next worker's reconciler does.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from celery_deadlines.ledger._crashpoints import PLAN_FILE_ENV
from celery_deadlines.models import Run, Status
from tests.integration.conftest import LEDGER_DB
from tests.support.processes import Transport, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("postgres"),
    pytest.mark.django_db(transaction=True, databases=[LEDGER_DB]),
]


@pytest.mark.parametrize("reject_on_worker_lost", ["0", "1"], ids=["ack-on-loss", "reject-on-loss"])
def test_a_worker_killed_after_its_run_succeeded_leaves_no_caller_waiting_or_misinformed(
    tmp_path: Path,
    redis_broker: Transport,
    ledger_client: Any,
    ledger_worker: Any,
    reject_on_worker_lost: str,
) -> None:
    task_id = f"kept-{uuid.uuid4().hex[:10]}"
    plan = tmp_path / "crashplan.json"
    plan.write_text(json.dumps({task_id: [{"point": "run.completed", "action": "kill"}]}))
    tasks = ledger_client(redis_broker)
    ledger_worker(
        redis_broker,
        concurrency=2,
        **{
            PLAN_FILE_ENV: str(plan),
            "TEST_ACKS_LATE": "1",
            "TEST_REJECT_ON_WORKER_LOST": reject_on_worker_lost,
            "TEST_VISIBILITY_TIMEOUT": "5",
            "TEST_LEASE_TTL": "2",
        },
    )
    result = tasks.report.apply_async(task_id=task_id, budget=60)

    assert result.get(timeout=45) == task_id  # the body's own return value
    fired = [json.loads(line) for line in Path(f"{plan}.fired.jsonl").read_text().splitlines()]
    assert [(f["task_id"], f["point"]) for f in fired] == [(task_id, "run.completed")]
    run = Run.objects.using(LEDGER_DB).get(task_id=task_id)
    assert (run.status, run.attempt) == (Status.SUCCEEDED, 1)  # never run again


def test_a_whole_worker_killed_after_its_run_succeeded_leaves_no_caller_waiting_for_good(
    tmp_path: Path, redis_broker: Transport, ledger_client: Any, ledger_worker: Any
) -> None:
    """Chaos soak, seed 778971: the message was acknowledged on receipt (Celery's
    default), so nothing is redelivered; the caller's result said nothing for good."""
    task_id = f"kept-{uuid.uuid4().hex[:10]}"
    plan = tmp_path / "crashplan.json"
    plan.write_text(json.dumps({task_id: [{"point": "run.completed", "action": "kill_worker"}]}))
    knobs = {PLAN_FILE_ENV: str(plan), "TEST_ACKS_LATE": "0"}
    tasks = ledger_client(redis_broker)
    first = ledger_worker(redis_broker, **knobs)
    result = tasks.report.apply_async(task_id=task_id, budget=60)

    assert first.process is not None
    wait_for(lambda: first.process.poll() is not None, timeout=30)  # the whole worker died
    assert Run.objects.using(LEDGER_DB).get(task_id=task_id).status == Status.SUCCEEDED
    assert result.state == "PENDING"  # and Celery stored nothing
    ledger_worker(redis_broker, **knobs)  # its supervisor starts it again

    assert result.get(timeout=45) == task_id  # the body's own return value
    fired = [json.loads(line) for line in Path(f"{plan}.fired.jsonl").read_text().splitlines()]
    assert [(f["task_id"], f["point"]) for f in fired] == [(task_id, "run.completed")]
    assert Run.objects.using(LEDGER_DB).get(task_id=task_id).attempt == 1  # never run again
