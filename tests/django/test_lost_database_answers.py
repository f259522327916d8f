"""An attempt's last write through a database connection that is lost meanwhile (the
nemesis soak, seed 101): the body's outcome is not the connection's error."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError

from celery_deadlines.errors import StaleLease
from celery_deadlines.ledger import attempt as attempts
from celery_deadlines.ledger.attempt import Attempt
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.models import Run, RunEvent, Status
from tests.django.test_ledger_store import claim, new_run, won

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

TTL = timedelta(seconds=30)


@pytest.fixture
def attempt(monkeypatch: pytest.MonkeyPatch) -> Attempt:
    monkeypatch.setattr(attempts, "FINISH_RETRY_INTERVAL", 0)
    store = Store("default")
    assert store.outbox.enqueue(new_run())
    return Attempt(store, won(claim(store)), "w1:1", TTL)


def cut_once(monkeypatch: pytest.MonkeyPatch, attempt: Attempt, before: Callable[[], Any]) -> None:
    """The first ``finish`` runs ``before`` and then loses the connection."""
    runs = attempt.store.runs
    real = runs.finish
    calls: list[int] = []

    def finish(*args: Any, **kwargs: Any) -> bool:
        calls.append(1)
        if len(calls) == 1:
            before()
            raise OperationalError("consuming input failed: server closed the connection")
        return real(*args, **kwargs)

    monkeypatch.setattr(runs, "finish", finish)


def applied(kind: str) -> int:
    return RunEvent.objects.filter(run__task_id="run-1", kind=kind, outcome="applied").count()


def test_a_success_whose_commit_answer_was_lost_is_not_written_twice_or_failed(
    attempt: Attempt, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = attempt.store.runs.finish
    cut_once(monkeypatch, attempt, lambda: real(attempt.lease, attempt.owner, Status.SUCCEEDED))
    attempt.succeed()  # no error: the write had committed
    assert Run.objects.get(task_id="run-1").status == "SUCCEEDED"
    assert (applied("succeeded"), applied("failed")) == (1, 0)


def test_a_success_write_the_cut_lost_is_written_again(
    attempt: Attempt, monkeypatch: pytest.MonkeyPatch
) -> None:
    cut_once(monkeypatch, attempt, lambda: None)
    attempt.succeed()
    assert Run.objects.get(task_id="run-1").status == "SUCCEEDED"
    assert applied("succeeded") == 1


def test_a_run_taken_over_while_the_database_was_away_is_left_to_its_new_holder(
    attempt: Attempt, monkeypatch: pytest.MonkeyPatch
) -> None:
    def taken_over() -> None:
        Run.objects.filter(task_id="run-1").update(lease_token=attempt.lease.token + 1)

    cut_once(monkeypatch, attempt, taken_over)
    with pytest.raises(StaleLease):
        attempt.succeed()
    assert Run.objects.get(task_id="run-1").status == "RUNNING"
