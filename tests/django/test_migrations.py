"""Migrations keep existing rows readable in today's vocabulary (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from django.db import connections
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("celery_deadlines", "0005_clock_hold_plans_and_schedules")]
AFTER = [("celery_deadlines", "0006_run_delivery_task")]


@pytest.fixture
def executor(alias: str) -> Iterator[MigrationExecutor]:
    """The ledger's schema as it was before 0006; every migration again afterwards."""
    connection = connections[alias]
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    executor.loader.build_graph()
    yield executor
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def test_runs_the_sweeper_expired_before_claim_read_deadline_passed_after_migrating(
    alias: str, executor: MigrationExecutor
) -> None:
    old = executor.loader.project_state(BEFORE).apps
    run_model, event_model = (old.get_model("celery_deadlines", m) for m in ("Run", "RunEvent"))
    at = datetime(2026, 11, 1, 12, tzinfo=UTC)
    runs = run_model.objects.using(alias)
    swept = runs.create(
        task_id="swept",
        task_name="t",
        status="EXPIRED",
        reason="expired_before_claim",
        op="expire",
        op_detail="expired_before_claim",
        updated_at=at,
        created_at=at,
    )
    refused = runs.create(
        task_id="refused",
        task_name="t",
        status="EXPIRED",
        reason="deadline_passed",
        op="refuse",
        updated_at=at,
        created_at=at,
    )

    executor.loader.build_graph()
    executor.migrate(AFTER)

    new = executor.loader.project_state(AFTER).apps
    run_model, event_model = (new.get_model("celery_deadlines", m) for m in ("Run", "RunEvent"))
    runs = run_model.objects.using(alias)
    assert runs.get(pk=swept.pk).reason == "deadline_passed"
    assert runs.get(pk=refused.pk).reason == "deadline_passed"
    assert runs.get(pk=swept.pk).delivery_task is None  # not known for older rows
    events = event_model.objects.using(alias)
    assert not events.filter(reason="expired_before_claim").exists()
    assert not events.filter(detail="expired_before_claim").exists()
    # the rename is on the run's record: one audit event saying what the migration did
    renamed = events.filter(run_id=swept.pk, kind="migrate")
    assert [e.detail for e in renamed] == [
        "reason expired_before_claim renamed deadline_passed (migration 0006)"
    ]
    assert not events.filter(run_id=refused.pk, kind="migrate").exists()
