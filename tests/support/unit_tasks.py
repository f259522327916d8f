"""Helpers of the Celery tier's unit tests: a task, an attempt started by hand, a claim
in the worker's main process, the refusal a caller reads (fake clock, memory broker)."""

from __future__ import annotations

from typing import Any
from unittest.mock import Mock

from celery import Celery
from celery.contrib.testing.mocks import TaskMessage

from celery_deadlines import DeadlineRefused, DeadlineTask
from celery_deadlines.core.request import DeadlineRequest


def stored_refusal(app: Celery, task_id: str) -> DeadlineRefused:
    """The refusal the worker stored for ``task_id``, as a caller would read it."""
    result = app.AsyncResult(task_id)
    assert result.state == "FAILURE"
    refusal = result.result
    assert isinstance(refusal, DeadlineRefused), refusal
    return refusal


def make_task(app: Celery, name: str = "unit.work", **options: Any) -> Any:
    @app.task(base=DeadlineTask, bind=True, name=name, shared=False, **options)
    def work(self: DeadlineTask) -> float:
        return self.remaining()

    return work


def start_attempt(task: Any, headers: dict[str, Any], task_id: str = "t-1") -> None:
    task.push_request(id=task_id, headers=headers, retries=0, called_directly=False)
    task.before_start(task_id, (), {})


def claim(
    app: Celery, task: Any, headers: dict[str, Any], task_id: str = "m-1"
) -> tuple[DeadlineRequest, Mock]:
    message = TaskMessage(task.name, id=task_id, **headers)
    on_ack = Mock()
    request = DeadlineRequest(message, app=app, task=task, on_ack=on_ack)
    return request, on_ack
