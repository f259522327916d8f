"""The enqueue gate's rule for the queue ahead (rules/backlog.py) against a real Redis
broker and a real ``celery worker``: a publish the queue cannot reach before its last
start is refused in the caller, with the arithmetic, and nothing is refused while the
worker keeps up with what is published."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py

from celery_deadlines import DeadlineRefused
from celery_deadlines.core import workload
from celery_deadlines.signals import deadline_refused
from tests.integration.conftest import client_for, rabbitmq_transport, require, transport_named
from tests.support.processes import Transport

pytestmark = pytest.mark.integration


ARITHMETIC = re.compile(
    r"(?P<depth>\d+) messages ahead \((?P<queued>\d+) in its queue, (?P<held>\d+) held by "
    r"its workers\), started at (?P<rate>[\d.]+)/s "
    r"\(measured over (?P<span>[\d.]+) s\): a wait of (?P<wait>[\d.]+) s, more than the "
    r"(?P<left>[\d.]+) s left before its last start \(the deadline less the reserve of "
    r"(?P<reserve>[\d.]+) s\)"
)


def refused_within(task: Any, budget: float, tries: int = 100) -> DeadlineRefused | None:
    """Publish ``task`` every 50 ms until a publish is refused, or ``tries`` were not."""
    for _ in range(tries):
        try:
            task.apply_async((0.2,), budget=budget)
        except DeadlineRefused as exc:
            return exc
        time.sleep(0.05)
    return None


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
        refused = refused_within(deadline_sleeper, budget=2)
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
    assert int(figures["queued"]) + int(figures["held"]) == depth
    assert [(d.gate, d.reason) for d in signalled] == [("enqueue", "queue_backlog")]


@pytest.mark.parametrize(
    ("broker", "prefetch"), [("redis", "1"), ("redis", "4"), ("rabbitmq", "4")]
)  # 4: Celery's default
def test_publishing_at_the_worker_s_capacity_refuses_nothing(
    queue: str, start_worker: Any, tmp_path: Path, broker: str, prefetch: str
) -> None:
    from tests.support.workerapp import app, deadline_sleeper

    transport = transport_named(broker, tmp_path)
    require(transport)
    with client_for(transport, queue, app):
        start_worker(transport, concurrency=2, extra_args=("--prefetch-multiplier", prefetch))
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


def reports(transport: Transport, queue: str) -> dict[bytes, list[int]]:
    """The queue's workers' reports: seq, held, received, started."""
    client = redis_py.Redis.from_url(transport.broker_url)
    try:
        raw: dict[bytes, bytes] = client.hgetall(workload.key(queue))  # type: ignore[assignment]
    finally:
        client.close()
    return {field: [int(n) for n in value.split()] for field, value in raw.items()}


def wait_for(condition: Any, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = condition()
        if seen:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"not seen in {timeout} s")


@pytest.mark.parametrize(
    ("pool", "holds"),
    [
        ("prefork", 6),
        ("threads", 6),
        # a green pool's spawn waits for a free greenlet: the consumer holds the one
        # message it is handing over, and takes no other off the queue meanwhile
        ("gevent", 1),
    ],
)
def test_a_worker_reports_what_it_holds_not_started_and_what_it_received_and_started(
    redis: Transport, redis_client: Any, queue: str, start_worker: Any, pool: str, holds: int
) -> None:
    from tests.support.workerapp import deadline_sleeper

    worker = start_worker(
        redis, pool=pool, concurrency=2, extra_args=("--prefetch-multiplier", "4")
    )
    for _ in range(20):
        deadline_sleeper.apply_async((0.5,), budget=60)
    # two in the pool and eight messages prefetched: six held, not started
    (field,) = wait_for(
        lambda: [f for f, (_, held, *_) in reports(redis, queue).items() if held == holds]
    )
    seq, held, received, started = reports(redis, queue)[field]
    assert received >= started + held
    later = wait_for(lambda: (r := reports(redis, queue)[field])[3] >= started + 2 and r)
    assert later[0] > seq  # the sequence grows with every report
    worker.stop()
    assert field not in reports(redis, queue)  # a worker that stops removes its report


def test_a_publish_is_refused_for_the_messages_a_worker_holds_where_the_broker_shows_none(
    redis: Transport, redis_client: Any, queue: str, start_worker: Any
) -> None:
    from tests.support.workerapp import deadline_sleeper

    # one pool process that prefetches 40: the queue's list is empty, the work is held
    start_worker(redis, extra_args=("--prefetch-multiplier", "40"))
    for _ in range(40):
        deadline_sleeper.apply_async((0.2,), budget=120)
    wait_for(lambda: any(held > 30 for _, held, *_ in reports(redis, queue).values()))
    refused = refused_within(deadline_sleeper, budget=2)
    assert refused is not None, "never refused with 8 s of work held ahead of a 2 s budget"
    figures = ARITHMETIC.fullmatch(refused.detail)
    assert figures is not None, refused.detail
    assert int(figures["queued"]) < 10 < 20 < int(figures["held"])
    assert float(figures["wait"]) > float(figures["left"])


def test_a_report_that_stopped_changing_is_swept_away_by_a_live_worker(
    redis: Transport, queue: str
) -> None:
    client = redis_py.Redis.from_url(redis.broker_url)
    hash_key = workload.key(queue)
    counts = workload._Counts({}, queue)
    reporter = workload._Reporter(None, counts, [queue], b"celery@live:1")
    try:
        client.hset(hash_key, mapping={b"celery@gone:9": b"5 0 9 9", b"celery@busy:2": b"1 0 0 0"})
        client.hset(hash_key, b"celery@live:1", b"1 0 0 0")
        reporter.sweep(client)  # the first sweep only looks
        client.hset(hash_key, b"celery@busy:2", b"2 0 1 1")  # still reporting
        reporter.sweep(client)
        assert set(client.hgetall(hash_key)) == {b"celery@busy:2", b"celery@live:1"}
    finally:
        client.delete(hash_key)
        client.close()


@pytest.fixture
def rabbitmq() -> Transport:
    chosen = rabbitmq_transport()
    require(chosen)
    return chosen


@pytest.mark.parametrize("prefetch", ["1", "40"])
def test_on_rabbitmq_with_a_redis_result_backend_the_queue_and_what_its_workers_hold_refuse(
    rabbitmq: Transport, queue: str, start_worker: Any, prefetch: str
) -> None:
    from tests.support.workerapp import app, deadline_sleeper

    with client_for(rabbitmq, queue, app):
        # one pool process: with a prefetch of 1 the 40 wait in RabbitMQ's queue, with 40
        # in the worker, where RabbitMQ counts them as delivered, not ready
        start_worker(rabbitmq, extra_args=("--prefetch-multiplier", prefetch))
        for _ in range(40):
            deadline_sleeper.apply_async((0.2,), budget=120)
        refused = refused_within(deadline_sleeper, budget=2)
    assert refused is not None, "never refused with 8 s of work ahead of a 2 s budget"
    assert (refused.gate, refused.reason) == ("enqueue", "queue_backlog")
    figures = ARITHMETIC.fullmatch(refused.detail)
    assert figures is not None, refused.detail
    queued, held = int(figures["queued"]), int(figures["held"])
    assert queued + held > 20
    assert (queued if prefetch == "1" else held) > 20
    assert float(figures["wait"]) > float(figures["left"])
