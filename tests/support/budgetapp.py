"""A Celery app whose every task is a DeadlineTask under a default budget, as Celery's
own integration suite ran with it (``make celery-integration``): ``task_cls`` is
DeadlineTask and ``deadlines_default_budget`` 300 s, no ledger. Its tasks are those of
Celery's ``t/integration/tasks.py`` whose promises the budget must not replace
(tests/integration/test_celery_semantics.py). The broker, the result backend and the
queue come from the environment, as in ``workerapp``; the worker sends task events.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

#: ``deadlines_default_budget`` of the app: every task has this deadline from its publish
DEFAULT_BUDGET = 300

app = Celery("budgetapp", task_cls="celery_deadlines.task:DeadlineTask")
app.conf.update(
    broker_url=os.environ.get("TEST_BROKER_URL", "memory://"),
    result_backend=os.environ.get("TEST_RESULT_BACKEND", "cache+memory://"),
    task_default_queue=os.environ.get("TEST_QUEUE", "celery"),
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_extended=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    worker_send_task_events=True,
    broker_connection_retry_on_startup=True,
    deadlines_default_budget=DEFAULT_BUDGET,
    deadlines_ledger=False,
)


class ExpectedError(Exception):
    """What ``retry_forever`` fails with (Celery's ``ExpectedException``)."""


@app.task(name="c.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="c.sleeping")
def sleeping(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@app.task(name="c.tsum")
def tsum(numbers: list[int]) -> int:
    return sum(numbers)


@app.task(name="c.write_to_file_and_return_int")
def write_to_file_and_return_int(file_name: str, i: int) -> int:
    """Celery's: append ``i`` to ``file_name`` (line-buffered), return it."""
    with open(file_name, mode="a", buffering=1) as handle:
        handle.write(f"{i}\n")
    return i


@app.task(bind=True, name="c.retry_forever")
def retry_forever(self: Any, countdown: float) -> None:
    """Celery's ``retry`` task with Celery's default ``max_retries``: it always retries."""
    raise self.retry(exc=ExpectedError(f"retry {self.request.retries}"), countdown=countdown)
