"""The enqueue gate's rule for the queue ahead (rules/backlog.py) against a real Redis
broker and a real ``celery worker``: a publish the queue cannot reach before its last
start is refused in the caller, with the arithmetic, and nothing is refused while the
worker keeps up with what is published."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from celery_deadlines import DeadlineRefused
from celery_deadlines.signals import deadline_refused
from tests.support.processes import Transport

pytestmark = pytest.mark.integration


ARITHMETIC = re.compile(
    r"(?P<depth>\d+) messages ahead in its queue, taken off at (?P<rate>[\d.]+)/s "
    r"\(measured over (?P<span>[\d.]+) s\): a wait of (?P<wait>[\d.]+) s, more than the "
    r"(?P<left>[\d.]+) s left before its last start \(the deadline less the reserve of "
    r"(?P<reserve>[\d.]+) s\)"
)


def test_a_publish_its_queue_cannot_reach_in_time_is_refused_at_enqueue_with_the_arithmetic(
    redis: Transport, redis_client: Any, queue: str, start_worker: Any
) -> None:
    from tests.support.workerapp import deadline_sleeper

    start_worker(redis)  # one pool process, one message prefetched
    # 40 bodies of 0.2 s ahead: 8 s of work, on budgets long enough to wait it out
    for _ in range(40):
        deadline_sleeper.apply_async((0.2,), budget=120)
    signalled: list[Any] = []

    def heard(decision: Any, **_: Any) -> None:
        signalled.append(decision)

    deadline_refused.connect(heard, weak=False)
    try:
        # each publish reads the queue (every 50 ms at most); the gate judges once it
        # has seen the queue served for a quarter of a second
        refused = None
        for _ in range(100):
            try:
                deadline_sleeper.apply_async((0.2,), budget=2)
            except DeadlineRefused as exc:
                refused = exc
                break
            time.sleep(0.05)
    finally:
        deadline_refused.disconnect(heard)
    assert refused is not None, "never refused with 8 s of work ahead of a 2 s budget"
    assert (refused.gate, refused.reason) == ("enqueue", "queue_backlog")
    figures = ARITHMETIC.fullmatch(refused.detail)
    assert figures is not None, refused.detail
    depth, rate, wait = int(figures["depth"]), float(figures["rate"]), float(figures["wait"])
    # the sentence's own arithmetic: the wait is the messages ahead over their rate
    # (the rate said to a tenth, the wait to a millisecond)
    assert depth / (rate + 0.05) - 0.0005 <= wait <= depth / (rate - 0.05) + 0.0005
    assert wait > float(figures["left"])
    assert float(figures["left"]) <= 2.0
    assert float(figures["span"]) >= 0.25
    assert depth > 20  # most of the 40 still wait: the pool takes five a second
    assert [(d.gate, d.reason) for d in signalled] == [("enqueue", "queue_backlog")]


def test_publishing_at_the_worker_s_capacity_refuses_nothing(
    redis: Transport, redis_client: Any, queue: str, start_worker: Any
) -> None:
    from tests.support.workerapp import deadline_sleeper

    start_worker(redis, concurrency=2)
    # two pool processes and bodies of 0.1 s: 20 a second, published at 20 a second
    # for 4 s, each with a budget of 2 s
    results = []
    began = time.monotonic()
    for k in range(80):
        pause = began + k / 20 - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        results.append(deadline_sleeper.apply_async((0.1,), budget=2))  # never raises
    outcomes = [result.get(timeout=30) for result in results]
    assert [outcome["slept"] for outcome in outcomes] == [0.1] * 80
