"""What the caller's ``AsyncResult`` says, with real workers: never PENDING for a run the
ledger knows to be UNKNOWN or ended, whoever settles it."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import TimeoutError as NoResultYet

from celery_deadlines import DeadlineRefused, PerformedPastDeadline, RunConflict
from celery_deadlines.ledger.api import store_for
from celery_deadlines.ledger.operations import settle_effect
from celery_deadlines.models import Run
from tests.integration.conftest import LEDGER_DB, ended
from tests.support.processes import Transport, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("postgres"),
    pytest.mark.django_db(transaction=True, databases=[LEDGER_DB]),
]


def test_an_unknown_outcome_is_visible_to_the_caller_until_an_operator_settles_it(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path
) -> None:
    tasks = ledger_client(redis_broker)
    ledger_worker(redis_broker, TEST_LEASE_TTL="2")
    task_id, key = f"unknown-{uuid.uuid4().hex[:8]}", f"pay-{uuid.uuid4().hex[:8]}"
    result = tasks.ambiguous_pay.apply_async((key,), task_id=task_id, budget=60)

    state = wait_for(lambda: result.state if result.state != "PENDING" else None, 30)
    assert state == "UNKNOWN"
    assert result.info["effects"] == [key]
    assert "TimeoutError" in result.info["error"]
    assert "operator" in result.info["resolved_by"]
    assert Run.objects.using(LEDGER_DB).get(task_id=task_id).status == "UNKNOWN"
    with pytest.raises(NoResultYet):  # get() waits for the outcome; it has none yet
        result.get(timeout=1)

    # an operator finds the payment in the provider's records and says so
    settled = operator_finds_the_payment(tasks.app, task_id, key)
    assert (settled.applied, settled.released) == (True, "QUEUED")

    assert result.get(timeout=30) == {"paid": key}  # replayed, not paid again
    assert ended(task_id).status == "SUCCEEDED"
    paid = [line for line in sink.read_text().splitlines() if '"effect"' in line]
    assert len(paid) == 1


def test_a_reused_task_id_is_the_same_run_or_a_conflict_never_silently_another_run(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path
) -> None:
    from celery.signals import after_task_publish

    tasks = ledger_client(redis_broker)
    ledger_worker(redis_broker)
    task_id, key = f"reused-{uuid.uuid4().hex[:8]}", f"k-{uuid.uuid4().hex[:8]}"
    published: list[str] = []

    def count(headers: dict[str, Any] | None = None, **_: Any) -> None:
        published.append(str((headers or {}).get("id")))

    after_task_publish.connect(count, weak=False)
    try:
        first = tasks.effect.apply_async((key,), task_id=task_id, budget=60)
        assert first.get(timeout=30)["key"] == key
        again = tasks.effect.apply_async((key,), task_id=task_id, budget=60)
        assert again.get(timeout=5) == first.get()  # the existing run's result
        with pytest.raises(RunConflict, match="now with args"):
            tasks.effect.apply_async((f"{key}-other",), task_id=task_id, budget=60)
        with pytest.raises(RunConflict, match=r"first used for l\.effect"):
            tasks.crash_first.apply_async((key,), task_id=task_id, budget=60)
    finally:
        after_task_publish.disconnect(count)
    assert published.count(task_id) == 1  # nothing was published again
    run = Run.objects.using(LEDGER_DB).get(task_id=task_id)
    assert (run.status, run.attempt) == ("SUCCEEDED", 1)
    effects = [line for line in sink.read_text().splitlines() if '"effect"' in line]
    assert len(effects) == 1


def test_an_unknown_run_settled_after_its_deadline_fails_for_the_caller_not_pending(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path
) -> None:
    tasks = ledger_client(redis_broker)
    ledger_worker(redis_broker)
    task_id, key = f"late-{uuid.uuid4().hex[:8]}", f"pay-{uuid.uuid4().hex[:8]}"
    result = tasks.ambiguous_pay.apply_async((key,), task_id=task_id, budget=3)
    wait_for(lambda: result.state == "UNKNOWN", 30)
    run = Run.objects.using(LEDGER_DB).get(task_id=task_id)
    wait_for(lambda: run.deadline is not None and ended_before(run.deadline), 10)

    # the operator's resolve, after the deadline: the same operation the admin calls
    settled = operator_finds_the_payment(tasks.app, task_id, key)
    assert (settled.applied, settled.released) == (True, "EXPIRED")
    with pytest.raises(DeadlineRefused) as refused:
        result.get(timeout=10)
    # the payment happened: the caller is told so, through the result backend's JSON
    assert isinstance(refused.value, PerformedPastDeadline)
    assert (refused.value.gate, refused.value.reason) == ("release", "performed_past_deadline")
    assert refused.value.deadline_at == run.deadline
    assert ended(task_id).status == "EXPIRED"


def ended_before(instant: Any) -> bool:
    from django.db import connections

    with connections[LEDGER_DB].cursor() as cursor:
        cursor.execute("SELECT clock_timestamp() > %s", [instant])
        return bool(cursor.fetchone()[0])


def operator_finds_the_payment(app: Any, task_id: str, key: str) -> Any:
    """An operator resolves the run's pending effect as found, with evidence: the same
    operation the admin's resolve calls."""
    store = store_for(app)
    [seen] = [p for p in store.effects.pending() if p.task_id == task_id]
    return settle_effect(
        app,
        store,
        seen,
        found=True,
        result={"paid": key},
        evidence="dashboard",
        by="operator ops",
    )
