"""Seed 004's test matrix, the rows about effects and delivery, with real workers.

Real ``celery worker`` processes of ``tests.support.ledgerapp`` on Redis and
PostgreSQL; the provider is a process of its own whose append-only log is the count of
side effects (``tests/support/sink.py``). Crashes and pauses are planned per task id
through ``celery_deadlines.ledger._crashpoints``.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from celery_deadlines.ledger._crashpoints import PLAN_FILE_ENV
from celery_deadlines.models import Run, RunEvent, Status
from tests.integration.conftest import LEDGER_DB, ended, provider_calls
from tests.support.processes import Transport, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("postgres"),
    pytest.mark.django_db(transaction=True, databases=[LEDGER_DB]),
]
DB = LEDGER_DB


def events(task_id: str) -> list[RunEvent]:
    return list(RunEvent.objects.using(DB).filter(run__task_id=task_id))


def plan(tmp_path: Path, entries: dict[str, Any]) -> Path:
    path = tmp_path / "crashplan.json"
    path.write_text(json.dumps(entries))
    return path


def test_execution_expires_but_the_notice_is_delivered_once_while_still_useful(
    tmp_path: Path,
    redis_broker: Transport,
    ledger_client: Any,
    ledger_worker: Any,
    provider: tuple[str, Path],
) -> None:
    url, log = provider
    order_id, notify_id = f"order-{uuid.uuid4().hex[:8]}", f"notice-{uuid.uuid4().hex[:8]}"
    # the notice's pool process dies after the provider took it, before recording it
    crash = plan(tmp_path, {notify_id: {"point": "effect.before_outcome", "action": "kill"}})
    tasks = ledger_client(redis_broker)
    ledger_worker(
        redis_broker,
        concurrency=2,
        TEST_SINK_URL=url,
        TEST_ACKS_LATE="1",
        **{PLAN_FILE_ENV: str(crash)},
    )
    # 2 s to act; the notice, sent 3 s later, is still worth sending for 30 s
    result = tasks.order.apply_async((order_id, notify_id, 3.0), budget=2, delivery_budget=30)
    result.get(timeout=30)
    notice = wait_for(lambda: ended(notify_id), 45)
    business = Run.objects.using(DB).get(task_id=result.id)
    assert business.status == Status.SUCCEEDED
    assert (notice.status, notice.deadline) == (Status.SUCCEEDED, business.delivery_deadline)
    assert business.deadline is not None
    first_claim = next(e for e in events(notify_id) if (e.kind, e.outcome) == ("claim", "applied"))
    assert first_claim.at > business.deadline  # it ran after execution expired
    assert len(provider_calls(log, f"{order_id}:pay:v1")) == 1  # the business action: once
    assert len(provider_calls(log, f"{order_id}:completion:v1")) == 1  # the notice: once
    effect = notice.effects.get()
    assert (effect.state, effect.evidence) == ("SUCCEEDED", "provider lookup: 1 call(s)")
    assert "effect_unknown" in [e.kind for e in events(notify_id)]  # lost, then reconciled


def test_a_notice_that_arrives_after_the_delivery_deadline_is_never_sent_and_reruns_nothing(
    tmp_path: Path,
    redis_broker: Transport,
    ledger_client: Any,
    ledger_worker: Any,
    provider: tuple[str, Path],
) -> None:
    url, log = provider
    order_id, notify_id = f"order-{uuid.uuid4().hex[:8]}", f"notice-{uuid.uuid4().hex[:8]}"
    # the notice's pool process stalls for 5 s right before its claim: the queue delay
    # of seed 004, landing past the delivery deadline
    stall = plan(tmp_path, {notify_id: {"point": "claim.before", "action": "stop:5"}})
    tasks = ledger_client(redis_broker)
    ledger_worker(redis_broker, concurrency=2, TEST_SINK_URL=url, **{PLAN_FILE_ENV: str(stall)})
    result = tasks.order.apply_async((order_id, notify_id, 0.5), budget=2, delivery_budget=2.5)
    result.get(timeout=30)
    notice = wait_for(lambda: ended(notify_id), 30)
    # the stalled process is killed by its time limit (capped at the delivery deadline)
    # before it can claim; the sweeper ends the run once that deadline passed unclaimed
    assert (notice.status, notice.reason) == (Status.EXPIRED, "delivery_expired")
    assert notice.deadline == Run.objects.using(DB).get(task_id=result.id).delivery_deadline
    assert ("claim", "applied") not in [(e.kind, e.outcome) for e in events(notify_id)]
    assert provider_calls(log, f"{order_id}:completion:v1") == []
    assert len(provider_calls(log, f"{order_id}:pay:v1")) == 1
    business = Run.objects.using(DB).get(task_id=result.id)
    assert (business.status, business.attempt) == (Status.SUCCEEDED, 1)  # not run again


def test_a_duplicate_delivery_racing_the_deadline_is_decided_by_one_key_and_the_provider(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path
) -> None:
    tasks = ledger_client(redis_broker)
    ledger_worker.together(2, redis_broker)
    task_id = f"race-{uuid.uuid4().hex[:8]}"
    # the same run dispatched twice, to two workers (a duplicate message: apply_async again
    # would publish nothing); the provider takes the payment and then hangs past the 2 s
    # deadline
    tasks.slow_pay.apply_async(("race",), task_id=task_id, budget=2)
    tasks.app.send_task("l.slow_pay", ("race",), task_id=task_id, budget=2)
    run = wait_for(lambda: ended(task_id), 30)
    # the provider took the payment: the run ended past its deadline after it
    assert (run.status, run.reason) == (Status.EXPIRED, "performed_past_deadline")
    effect = run.effects.get()
    assert (effect.state, effect.evidence, effect.dispatches) == (
        "SUCCEEDED",
        "sink lookup: found",
        1,
    )
    kinds = [(e.kind, e.outcome) for e in events(task_id)]
    assert kinds.count(("claim", "applied")) == 1
    assert ("claim", "rejected") in kinds  # the duplicate never started
    assert ("effect_unknown", "applied") in kinds  # cut by the deadline, then reconciled
    effects = [
        line for line in map(json.loads, sink.read_text().splitlines()) if line["kind"] == "effect"
    ]
    assert len(effects) == 1
