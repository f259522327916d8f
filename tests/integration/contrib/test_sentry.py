"""What an error tracker sees of a real ``celery worker`` reported to Sentry.

The worker (``tests.support.sentryapp``: prefork, sentry-sdk's Celery and logging
integrations as an application sets them up) records every Sentry event and
transaction in a file instead of sending it. An expected refusal stays quiet: no error
event, and a transaction status that says what happened (``deadline_exceeded``), not
``internal_error``. A run that needs a person (UNKNOWN, and no reconciler of its task
can settle its effect) is one error-level event naming the run and what to do.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_deadlines import DeadlineRefused
from tests.integration.conftest import LEDGER_DB, forget_unacked, ledger_database_url
from tests.support.processes import Transport, WorkerProcess, wait_for

pytestmark = pytest.mark.integration

#: How often the ledger workers reconcile (``TEST_RECONCILE_INTERVAL``, ledgerapp's default).
RECONCILE_INTERVAL = 0.5


def recorded(path: Path) -> list[dict[str, Any]]:
    """Every event and transaction the worker's Sentry client sent, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def transaction_of(path: Path, task_id: str) -> dict[str, Any] | None:
    """The transaction of the task run ``task_id`` (tagged by the Celery integration)."""
    for item in recorded(path):
        payload: dict[str, Any] = item["payload"]
        if item["type"] == "transaction" and payload["tags"].get("celery_task_id") == task_id:
            return payload
    return None


def errors(path: Path) -> list[dict[str, Any]]:
    """The error-level events (what an error tracker raises an issue for)."""
    return [
        item["payload"]
        for item in recorded(path)
        if item["type"] == "event" and item["payload"].get("level") in ("error", "fatal")
    ]


def operator_alerts(path: Path, task_id: str) -> list[dict[str, Any]]:
    """The error-level events that ask a person to settle the run ``task_id``."""
    return [
        event
        for event in errors(path)
        if event.get("extra", {}).get("celery_deadlines.task_id") == task_id
    ]


# -- an expected refusal: no error event, an honest transaction status ---------------------


def test_a_refused_retry_is_a_deadline_exceeded_transaction_and_no_error_event(
    redis: Transport, redis_client: Any, start_worker: Any, tmp_path: Path
) -> None:
    from tests.support.workerapp import link_error_parent, manual_retry

    sentry_file = tmp_path / "sentry.jsonl"
    start_worker(
        redis,
        app_module="tests.support.sentryapp",
        extra_env={
            "TEST_SENTRY_APP": "tests.support.workerapp",
            "TEST_SENTRY_FILE": str(sentry_file),
        },
    )

    # the retry gate refuses a retry the budget cannot hold: an expected outcome
    refused = manual_retry.apply_async((30,), budget=5)
    with pytest.raises(DeadlineRefused) as raised:
        refused.get(timeout=20)
    assert (raised.value.gate, raised.value.reason) == ("retry", "retry_budget_exhausted")
    transaction = wait_for(lambda: transaction_of(sentry_file, refused.id), 20)
    assert transaction["contexts"]["trace"]["status"] == "deadline_exceeded"

    # a body's own error, on the same worker: still Sentry's internal_error and an event
    failed = link_error_parent.apply_async(budget=30)
    with pytest.raises(Exception, match="always"):
        failed.get(timeout=20)
    transaction = wait_for(lambda: transaction_of(sentry_file, failed.id), 20)
    assert transaction["contexts"]["trace"]["status"] == "internal_error"

    # each run's events are sent before its transaction: both transactions are in, so
    # every event of both runs is; the body's error is the only one
    [error] = errors(sentry_file)
    assert error["tags"]["celery_task_id"] == failed.id
    assert error["exception"]["values"][-1]["type"] == "ProviderDown"


# -- a run that needs a person: one error-level event -------------------------------------


@pytest.fixture
def sentry_worker(
    tmp_path: Path, queue: str, sink: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Path]]:
    """Start one ledger worker reported to Sentry (``env``: TEST_* knobs); returns the
    file its Sentry client writes. Killed after the test; its log printed on failure."""
    started: list[WorkerProcess] = []

    def start(transport: Transport, **env: str) -> Path:
        sentry_file = tmp_path / f"sentry-{len(started)}.jsonl"
        worker = WorkerProcess(
            transport,
            queue,
            tmp_path / f"sentry-worker-{len(started)}.log",
            app_module="tests.support.sentryapp",
            node=f"{queue}-{len(started)}",
            extra_env={
                "TEST_SENTRY_APP": "tests.support.sentry_tasks",
                "TEST_SENTRY_FILE": str(sentry_file),
                "TEST_DATABASE_URL": ledger_database_url(),
                "TEST_SINK": str(sink),
                "TEST_RECONCILE_INTERVAL": str(RECONCILE_INTERVAL),
                "DJANGO_SETTINGS_MODULE": "tests.support.ledger_settings",
                **env,
            },
        )
        started.append(worker)
        worker.start()
        return sentry_file

    yield start
    for worker in started:
        worker.kill()  # its shutdown is not under test
        forget_unacked(worker.transport.broker_url, queue)
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for worker in started:
            print(f"--- {worker.log_path.name} ---\n{worker.log()}")


def assert_asks_for_an_operator(alert: dict[str, Any], task_id: str, task: str, key: str) -> None:
    """The event names the run, its task and the effect, and says what to do."""
    assert alert["logger"] == "celery_deadlines"
    assert alert["level"] == "error"
    extra = alert["extra"]
    assert extra["celery_deadlines.task_name"] == task
    assert extra["celery_deadlines.effect_keys"] == [key]
    said = alert["logentry"]["formatted"]
    assert f"{task}[{task_id}] needs an operator" in said
    assert key in said
    assert "resolve it with evidence" in said


@pytest.mark.usefixtures("postgres")
@pytest.mark.django_db(transaction=True, databases=[LEDGER_DB])
def test_an_attempt_left_unknown_without_a_reconciler_is_one_error_event_naming_the_run(
    redis_broker: Transport, ledger_client: Any, sentry_worker: Any
) -> None:
    tasks = ledger_client(redis_broker)
    sentry_file = sentry_worker(redis_broker)
    task_id, key = f"unknown-{uuid.uuid4().hex[:8]}", f"pay-{uuid.uuid4().hex[:8]}"
    # pays, then loses the provider's reply; the task has no reconciler
    result = tasks.ambiguous_pay.apply_async((key,), task_id=task_id, budget=60)

    wait_for(lambda: result.state == "UNKNOWN", 30)
    [alert] = wait_for(lambda: operator_alerts(sentry_file, task_id), 20)
    assert_asks_for_an_operator(alert, task_id, "l.ambiguous_pay", key)
    assert alert["tags"]["celery_task_id"] == task_id  # sent from the task's own scope

    time.sleep(4 * RECONCILE_INTERVAL)  # reconcile passes: the run must not page again
    assert errors(sentry_file) == [alert]


@pytest.mark.usefixtures("postgres")
@pytest.mark.django_db(transaction=True, databases=[LEDGER_DB])
def test_a_worker_lost_after_a_dispatch_pages_once_only_when_no_reconciler_can_settle_it(
    redis_broker: Transport, ledger_client: Any, sentry_worker: Any
) -> None:
    tasks = ledger_client(redis_broker)
    from tests.support.sentry_tasks import pay_then_die

    sentry_file = sentry_worker(redis_broker, TEST_ACKS_LATE="1")

    # the task's reconciler finds the payment: nobody is needed, nobody is paged
    reconciled_key = f"pay-{uuid.uuid4().hex[:8]}"
    reconciled = tasks.pay.apply_async((reconciled_key,), {"crash": "after"}, budget=60)
    assert reconciled.get(timeout=45) == {"paid": reconciled_key, "reconciled": True}

    # no reconciler: the reconciler marks the lapsed run UNKNOWN, and that asks for a person
    task_id, key = f"orphan-{uuid.uuid4().hex[:8]}", f"pay-{uuid.uuid4().hex[:8]}"
    orphan = pay_then_die.apply_async((key,), task_id=task_id, budget=60)
    wait_for(lambda: orphan.state == "UNKNOWN", 30)
    [alert] = wait_for(lambda: operator_alerts(sentry_file, task_id), 20)
    assert_asks_for_an_operator(alert, task_id, "s.pay_then_die", key)

    time.sleep(4 * RECONCILE_INTERVAL)  # reconcile passes: the run must not page again
    assert operator_alerts(sentry_file, task_id) == [alert]
    assert operator_alerts(sentry_file, reconciled.id) == []
