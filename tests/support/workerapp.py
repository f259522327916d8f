"""The Celery app that integration tests run in real ``celery worker`` subprocesses.

Plain Celery, no Django: this is the "base=DeadlineTask and nothing else" tier. The
broker and result backend come from the environment (``TEST_BROKER_URL``,
``TEST_RESULT_BACKEND``) so one module serves Redis, RabbitMQ and the filesystem
transport. Tasks report what they saw (headers, remaining budget) in their results.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery, chord, group
from celery.exceptions import SoftTimeLimitExceeded

from celery_deadlines import DEADLINE_HEADER, ORIGIN_HEADER, SOURCE_HEADER, DeadlineTask
from celery_deadlines.clock import get_clock
from demo_project.broker import TRANSPORT


def _filesystem_options() -> dict[str, Any]:
    """kombu's filesystem transport, when the test chose it: its folders, polled every
    0.1 s (as the demo's settings do) rather than every second."""
    folders = {
        "data_folder_in": os.environ.get("TEST_FS_FOLDER"),
        "data_folder_out": os.environ.get("TEST_FS_FOLDER"),
        "control_folder": os.environ.get("TEST_FS_CONTROL"),
    }
    options: dict[str, Any] = {key: value for key, value in folders.items() if value}
    return {**options, "polling_interval": 0.1} if options else {}


app = Celery("workerapp")
app.conf.update(
    broker_url=os.environ.get("TEST_BROKER_URL", "memory://"),
    # the demo's filesystem transport (demo_project/broker.py: kombu#1551)
    broker_transport=TRANSPORT if os.environ.get("TEST_FS_FOLDER") else None,
    result_backend=os.environ.get("TEST_RESULT_BACKEND", "cache+memory://"),
    broker_transport_options=_filesystem_options(),
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_extended=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    deadlines_clock_skew_allowance=0.2,
    deadlines_ledger=False,  # the plain Celery tier, even in a process with Django
    task_default_queue=os.environ.get("TEST_QUEUE", "celery"),
)


class ProviderDown(Exception):
    """A transient error the tasks below retry on."""


def _seen(task: DeadlineTask) -> dict[str, Any]:
    headers = task.request.headers or {}
    return {
        "id": task.request.id,
        "deadline": headers.get(DEADLINE_HEADER),
        "source": headers.get(SOURCE_HEADER),
        "origin": headers.get(ORIGIN_HEADER),
        "expires": task.request.expires,
        "remaining": task.remaining(),
        "retries": task.request.retries,
    }


@app.task(base=DeadlineTask, bind=True, name="t.probe")
def probe(self: DeadlineTask, label: str = "") -> dict[str, Any]:
    return {"label": label, **_seen(self)}


@app.task(bind=True, name="t.plain_probe")
def plain_probe(self: Any, label: str = "") -> dict[str, Any]:
    """A plain Celery task (no DeadlineTask): it still inherits the header and expires."""
    headers = self.request.headers or {}
    return {
        "label": label,
        "deadline": headers.get(DEADLINE_HEADER),
        "expires": self.request.expires,
    }


@app.task(base=DeadlineTask, bind=True, name="t.collect")
def collect(self: DeadlineTask, results: list[Any]) -> dict[str, Any]:
    return {"members": results, **_seen(self)}


@app.task(base=DeadlineTask, bind=True, name="t.fan_out")
def fan_out(self: DeadlineTask, child_budget: float | None = None) -> dict[str, Any]:
    """Publish a child through every path Celery offers; return their ids."""
    extra: dict[str, Any] = {} if child_budget is None else {"budget": child_budget}
    ids = {
        "delay": probe.delay("delay").id,
        "apply_async": probe.apply_async(("apply_async",), **extra).id,
        "send_task": app.send_task("t.probe", ("send_task",)).id,
        "signature_set": probe.s("signature").set(priority=3).apply_async().id,
        "plain": plain_probe.delay("plain").id,
        "grandchild": child_of_child.delay().id,
        "link": probe.apply_async(("linked-parent",), link=probe.si("link")).id,
    }
    group_result: Any = group(probe.s("group-a"), probe.s("group-b")).apply_async()
    ids["group"] = [r.id for r in group_result.results]
    chord_result: Any = chord([probe.s("chord-a"), probe.s("chord-b")])(collect.s())
    ids["chord_body"] = chord_result.id
    ids["chord_header"] = [r.id for r in chord_result.parent.results]
    chain_result: Any = (probe.si("chain-1") | probe.si("chain-2")).apply_async()
    ids["chain_last"] = chain_result.id
    ids["chain_first"] = chain_result.parent.id
    return {"children": ids, **_seen(self)}


@app.task(base=DeadlineTask, bind=True, name="t.child_of_child")
def child_of_child(self: DeadlineTask) -> dict[str, Any]:
    return {"grandchild": probe.delay("grandchild").id, **_seen(self)}


@app.task(base=DeadlineTask, bind=True, name="t.forger")
def forger(self: DeadlineTask, hours: float = 1) -> dict[str, Any]:
    """Publish children whose headers claim a deadline ``hours`` away, as a caller may
    write any header: by name, through a DeadlineTask and as a plain task."""
    forged: dict[str, Any] = {
        DEADLINE_HEADER: get_clock().now().timestamp() + hours * 3600,
        SOURCE_HEADER: "call",
    }
    ids = {
        "send_task": app.send_task("t.probe", ("send_task",), headers=forged).id,
        "apply_async": probe.apply_async(("apply_async",), headers=forged).id,
        "plain": plain_probe.apply_async(("plain",), headers=forged).id,
    }
    return {"children": ids, **_seen(self)}


@app.task(base=DeadlineTask, bind=True, name="t.link_error_parent")
def link_error_parent(self: DeadlineTask) -> None:
    raise ProviderDown("always")


@app.task(name="t.sleeper")
def sleeper(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@app.task(name="t.tear_result_pipe")
def tear_result_pipe() -> str:
    """Write, on this prefork pool process's own result pipe, a message whose body is no
    pickle: what the worker's main process reads from a pipe that lost a message's
    boundary (a pool process killed while the main process was reading its message)."""
    from billiard.process import current_process

    process: Any = current_process()  # billiard's pool process: its Worker is its target
    process._target.outq._writer.send_bytes(b"\x01(no pickle)")
    return "torn"


@app.task(base=DeadlineTask, bind=True, name="t.deadline_sleeper")
def deadline_sleeper(self: DeadlineTask, seconds: float) -> dict[str, Any]:
    started = _seen(self)
    time.sleep(seconds)
    return {"slept": seconds, **started}


@app.task(base=DeadlineTask, bind=True, name="t.cleanup", time_limit=60, soft_time_limit=50)
def cleanup(self: DeadlineTask, seconds: float) -> dict[str, Any]:
    """Sleeps past its deadline unless the (capped) soft time limit interrupts it."""
    started = time.monotonic()
    try:
        time.sleep(seconds)
    except SoftTimeLimitExceeded:
        return {"interrupted_after": time.monotonic() - started, **_seen(self)}
    return {"interrupted_after": None}


# a reserve much longer than a worker takes to start: a message published with a
# budget just above it is refused for insufficient budget however fast the worker is
@app.task(base=DeadlineTask, bind=True, name="t.reserved", reserve=60)
def reserved(self: DeadlineTask) -> dict[str, Any]:
    return _seen(self)


@app.task(
    base=DeadlineTask,
    bind=True,
    name="t.flaky",
    autoretry_for=(ProviderDown,),
    retry_backoff=1,
    retry_jitter=False,
    max_retries=10,
    attempt_timeout=1,
)
def flaky(self: DeadlineTask) -> None:
    raise ProviderDown(f"attempt {self.request.retries}")


@app.task(base=DeadlineTask, bind=True, name="t.manual_retry", attempt_timeout=0.5, max_retries=3)
def manual_retry(self: DeadlineTask, countdown: float) -> dict[str, Any]:
    if self.request.retries == 0:
        raise self.retry(countdown=countdown, exc=ProviderDown("first attempt failed"))
    return _seen(self)


@app.task(base=DeadlineTask, bind=True, name="t.watch_remaining")
def watch_remaining(
    self: DeadlineTask, seconds: float, step: float = 0.1, started_file: str | None = None
) -> dict[str, Any]:
    """Sample remaining() and the wall clock while a test moves the worker's wall clock.

    Each sample is (monotonic seconds since the first sample, read right before the
    remaining() call; remaining(); the same, read right after it; the worker's wall
    clock, as the library reads it). ``started_file`` is created once the attempt runs,
    so that a test can change the clock *during* the attempt.
    """
    if started_file is not None:
        open(started_file, "x").close()
    samples = []
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        before = time.monotonic() - started
        remaining = self.remaining()
        after = time.monotonic() - started
        samples.append((before, remaining, after, get_clock().now().timestamp()))
        time.sleep(step)
    return {"samples": samples, **_seen(self)}


# -- the reader's tasks the docs' examples call (tests/repository/test_doc_blocks_run.py) --


@app.task(base=DeadlineTask, bind=True, name="docs.fetch")
def docs_fetch(self: DeadlineTask, url: str) -> dict[str, Any]:
    return {"url": url, **_seen(self)}


@app.task(base=DeadlineTask, bind=True, name="docs.merge")
def docs_merge(self: DeadlineTask, pages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"urls": [page["url"] for page in pages], **_seen(self)}


@app.task(base=DeadlineTask, bind=True, name="docs.charge")
def docs_charge(self: DeadlineTask, order_id: int) -> dict[str, Any]:
    return {"charged": order_id, **_seen(self)}


@app.task(base=DeadlineTask, bind=True, name="docs.ship", budget=30)
def docs_ship(self: DeadlineTask, order_id: int) -> dict[str, Any]:
    """The shop's ``ship``, as docs/howto/give-a-task-a-deadline.md defines it."""
    return {"shipped": order_id, **_seen(self)}
