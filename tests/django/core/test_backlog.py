"""A publish refused at enqueue for the queue ahead (``queue_backlog``) with the run
ledger on: recorded as every enqueue refusal is, explained with its arithmetic, and
counted in the metrics. The queue's reading is given (the broker here is kombu's
memory transport, which the estimator does not read: tests/integration has the real
Redis one)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from prometheus_client import CollectorRegistry

from celery_deadlines import DeadlineRefused
from celery_deadlines.contrib import prometheus as metrics
from celery_deadlines.core import backlog
from celery_deadlines.explain import explanation_of, render_text
from celery_deadlines.models import Run, Status
from celery_deadlines.rules.backlog import Backlog
from tests.support.unit_tasks import make_task

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

BEHIND = Backlog(depth=100, rate=80.0, offered=80.0, span=1.0)


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("backlog", broker="memory://", backend="cache+memory://")
    app.conf.update(deadlines_ledger=True, deadlines_database="default")
    yield app
    app.close()


@pytest.fixture
def a_queue_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every reading of a queue shows 100 messages ahead, taken off at 80 a second."""

    def read(self: Any, app: Any, now: float) -> None:
        self.read_at = now
        self.judged = BEHIND

    monkeypatch.setattr(backlog._Watch, "read", read)


def test_a_publish_refused_for_the_queue_ahead_is_recorded_explained_and_counted(
    app: Celery, a_queue_behind: None
) -> None:
    registry = CollectorRegistry()
    metrics.install(registry)
    task = make_task(app, "shop.report", budget=1, reserve=0.06)
    with pytest.raises(DeadlineRefused) as refused:
        task.apply_async(task_id="report-1", queue="reports")
    arithmetic = (
        "100 messages ahead in its queue, taken off at 80.0/s (measured over 1.00 s): a "
        "wait of 1.250 s, more than the 0.940 s left before its last start"
    )
    assert (refused.value.gate, refused.value.reason) == ("enqueue", "queue_backlog")
    assert arithmetic in refused.value.detail
    run = Run.objects.get(task_id="report-1")
    assert (run.status, run.reason) == (Status.EXPIRED, "queue_backlog")
    explained = explanation_of("report-1")
    assert explained is not None
    assert arithmetic in "\n".join(render_text(explained))
    labels = {"task": "shop.report", "gate": "enqueue", "reason": "queue_backlog"}
    assert registry.get_sample_value("celery_deadlines_refusals_total", labels) == 1


def test_with_the_setting_off_the_queue_ahead_refuses_nothing(
    app: Celery, a_queue_behind: None
) -> None:
    app.conf.deadlines_backlog_refusal = False
    task = make_task(app, "shop.report", budget=1, reserve=0.06)
    task.apply_async(task_id="report-2", queue="reports")
    assert Run.objects.get(task_id="report-2").status == Status.QUEUED


def test_a_repeated_publish_refused_for_the_queue_ahead_leaves_the_run_it_repeats_queued(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller publishes under its own id, is not sure it went through, and publishes
    again while the queue is long: the refusal is told, and the run first published
    stands, queued, to run in time (a refused repeat never ends the run it repeats)."""
    task = make_task(app, "shop.report", budget=1, reserve=0.06)
    task.apply_async(task_id="report-3", queue="reports")
    reads(app, monkeypatch, _behind)
    with pytest.raises(DeadlineRefused):
        task.apply_async(task_id="report-3", queue="reports")
    assert Run.objects.get(task_id="report-3").status == Status.QUEUED


def test_a_publish_refused_for_the_queue_ahead_is_judged_again_when_its_caller_tries_again(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing was sent, and the caller was told: a publish under the same id later is
    a new try, judged again, and published when the queue can reach it (it would
    otherwise be the ended run's duplicate, answered never)."""
    task = make_task(app, "shop.report", budget=1, reserve=0.06)
    reads(app, monkeypatch, _behind)
    with pytest.raises(DeadlineRefused):
        task.apply_async(task_id="report-4", queue="reports")
    assert Run.objects.get(task_id="report-4").status == Status.EXPIRED
    reads(app, monkeypatch, _short)
    task.apply_async(task_id="report-4", queue="reports")
    run = Run.objects.get(task_id="report-4")
    assert (run.status, run.reason) == (Status.QUEUED, "")
    assert run.message_body is not None


def reads(app: Celery, monkeypatch: pytest.MonkeyPatch, read: Any) -> None:
    """From now on every reading of a queue is ``read``'s (the queues watched so far
    forgotten: the next publish reads its queue at once)."""
    monkeypatch.setattr(backlog._Watch, "read", read)
    monkeypatch.setattr(app, backlog._WATCHES, {}, raising=False)


def _behind(self: Any, app: Any, now: float) -> None:
    self.read_at, self.judged = now, BEHIND


def _short(self: Any, app: Any, now: float) -> None:
    self.read_at, self.judged = now, BEHIND._replace(depth=1)
