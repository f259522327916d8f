"""The app the overhead benchmark runs in a real worker: one plain task, one DeadlineTask."""

from __future__ import annotations

import os
import time

import redis
from celery import Celery, Task

from celery_deadlines import DeadlineTask

app = Celery("benchapp")
app.conf.update(
    broker_url=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/12"),
    result_backend=os.environ.get("BENCH_RESULT_BACKEND", "redis://127.0.0.1:6379/13"),
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    task_default_queue=os.environ.get("BENCH_QUEUE", "bench"),
)


@app.task(base=Task, name="bench.plain")
def plain(x: int) -> int:
    return x


@app.task(base=DeadlineTask, name="bench.deadline", budget=300)
def deadline(x: int) -> int:
    return x


@app.task(base=DeadlineTask, name="bench.nobudget", budget=None)
def nobudget(x: int) -> int:
    return x


@app.task(name="bench.sentinel", ignore_result=False)
def sentinel() -> str:
    return "done"


MARKS_URL = os.environ.get("BENCH_MARKS_URL", "redis://127.0.0.1:6379/13")


@app.task(name="bench.mark")
def mark(key: str) -> None:
    """Record when the worker reached this point of a queue (worker clock, epoch seconds)."""
    with redis.Redis.from_url(MARKS_URL) as store:
        store.set(key, time.time())


def wait_for_mark(store: redis.Redis, key: str, queue: str, seconds: float = 600) -> float:
    """Wait until the worker has run ``mark(key)``, queued last on ``queue``: the worker's
    instant then (raises ``TimeoutError`` after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while (value := store.get(key)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker did not drain {queue}")
        time.sleep(0.02)
    return float(value)
