"""The overload benchmark's tasks (``bench/overload.py``): each sleeps 50 ms, as a
prefork worker's job that waits on I/O, and returns the instant its body started.

Two apps, one per worker: ``app`` (no Django: plain Celery, Celery's ``expires`` and
the header tier, ``deadlines_ledger`` off) and, in :mod:`bench.overloadledger`, the
same DeadlineTask recorded by the run ledger on PostgreSQL. Each DeadlineTask is also
declared in an app of its own with ``deadlines_backlog_refusal = False`` (the library
without its refusal at enqueue), published to the same worker.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery, Task

from celery_deadlines import DeadlineTask

#: what one task's body takes (seconds), and the budget and reserve DeadlineTask declares
WORK = 0.05
BUDGET = 1.0
RESERVE = 0.06


def configure(app: Celery) -> None:
    app.conf.update(
        broker_url=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/12"),
        result_backend=os.environ.get("BENCH_RESULT_BACKEND", "redis://127.0.0.1:6379/13"),
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        result_expires=3600,
    )


def body(published: float) -> list[float]:
    """The work: 50 ms; the publish instant the message carries, and the body's start."""
    started = time.time()
    time.sleep(WORK)
    return [published, started]


app = Celery("overload")
configure(app)
app.conf.deadlines_ledger = False  # the header tier, whatever the process has installed


@app.task(base=Task, name="overload.plain", shared=False)
def plain(published: float) -> Any:
    return body(published)


@app.task(base=DeadlineTask, name="overload.header", budget=BUDGET, reserve=RESERVE, shared=False)
def header(published: float) -> Any:
    return body(published)


#: the same task published with the refusal at enqueue turned off (the library before
#: issue 49): an app of its own, whose setting says so; the worker runs it as ``header``
before = Celery("overload-before")
configure(before)
before.conf.deadlines_ledger = False
before.conf.deadlines_backlog_refusal = False


@before.task(
    base=DeadlineTask, name="overload.header", budget=BUDGET, reserve=RESERVE, shared=False
)
def header_before(published: float) -> Any:
    return body(published)


@app.task(name="overload.sentinel", shared=False)
def sentinel() -> str:
    return "ready"
