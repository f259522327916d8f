"""Seed 004's test matrix against real ``celery worker`` processes and real brokers.

Every test publishes through the real client API, lets a real worker subprocess
(prefork unless said otherwise) take the message, and reads the outcome back through
the result backend, the way an application would.

A test that needs no topology of its own runs on a worker it shares with the module's
other tests (one per transport, and one whose wall clock the tests shift); a test that
publishes before any worker consumes (the queue delay under test), or needs a pool of
one process, starts its own.
"""

from __future__ import annotations

import itertools
import re
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import TimeLimitExceeded

from celery_deadlines import DEADLINE_HEADER, DeadlineRefused
from tests.integration.conftest import (
    TRANSPORTS,
    Shared,
    SharedWorkers,
    client_for,
    logs_on_failure,
    require,
    transport_named,
    unacked_of,
)
from tests.support.processes import Transport, WorkerProcess, shift_wall_clock, wait_for

pytestmark = pytest.mark.integration


def refusal_of(result: Any, timeout: float = 20) -> DeadlineRefused:
    with pytest.raises(DeadlineRefused) as raised:
        result.get(timeout=timeout)
    return raised.value


def shared_worker(
    workers: SharedWorkers, transport_name: str, name: str | None = None, **options: Any
) -> Shared:
    """The module's worker ``name`` on ``transport_name`` (prefork, two processes)."""

    def start(folder: Path, queue: str) -> tuple[Transport, WorkerProcess]:
        transport = transport_named(transport_name, folder)
        require(transport)
        worker = WorkerProcess(transport, queue, folder / "worker.log", concurrency=2, **options)
        return transport, worker

    return workers.get(name or transport_name, start)


def on_shared(request: pytest.FixtureRequest, shared: Shared) -> Iterator[Any]:
    with logs_on_failure(request, shared.worker), client_for(shared.transport, shared.queue) as app:
        yield app


@pytest.fixture(params=TRANSPORTS)
def shared_client(request: pytest.FixtureRequest, shared_workers: SharedWorkers) -> Iterator[Any]:
    """The test app, publishing to the module's running worker on each transport."""
    yield from on_shared(request, shared_worker(shared_workers, request.param))


@pytest.fixture
def shared_redis_client(
    request: pytest.FixtureRequest, shared_workers: SharedWorkers
) -> Iterator[Any]:
    """The test app, publishing to the module's running worker on Redis."""
    yield from on_shared(request, shared_worker(shared_workers, "redis"))


@pytest.fixture
def shifted_client(
    request: pytest.FixtureRequest, shared_workers: SharedWorkers
) -> Iterator[tuple[Any, Path]]:
    """The test app and the running Redis worker whose wall clock is shifted by the
    seconds written to the file returned (0 when the test begins)."""
    shift = shared_workers.folder / "shift"
    shift_wall_clock(shift, 0)
    shared = shared_worker(shared_workers, "redis", "shifted", clock_shift_file=shift)
    for app in on_shared(request, shared):
        yield app, shift
    shift_wall_clock(shift, 0)


def test_queue_delay_that_consumes_the_budget_makes_the_worker_refuse_to_claim(
    transport: Transport, client: Any, start_worker: Any
) -> None:
    from tests.support.workerapp import probe

    # Given a message whose 1.5 s budget runs out while no worker is consuming
    result = probe.apply_async(("late",), budget=1.5)
    time.sleep(2.0)  # the queue delay under test, on the real clock of a real broker
    # When a worker finally takes it
    start_worker(transport)
    # Then it refuses to start it, and the caller learns why
    refusal = refusal_of(result)
    assert (refusal.gate, refusal.reason) == ("claim", "deadline_passed")
    assert refusal.clock_read_at > refusal.deadline_at  # type: ignore[operator]
    assert result.state == "FAILURE"


def test_time_waiting_behind_busy_pool_processes_counts_against_the_budget(
    redis: Transport, redis_client: Any, start_worker: Any
) -> None:
    from tests.support.workerapp import probe, sleeper

    start_worker(redis, concurrency=1)
    busy = sleeper.delay(2.5)
    time.sleep(0.3)  # let the only pool process take the sleeper first
    waiting = probe.apply_async(("behind",), budget=1.5)
    refusal = refusal_of(waiting)
    assert (refusal.gate, refusal.reason) == ("claim", "deadline_passed")
    assert busy.get(timeout=10) == 2.5


def test_a_refused_message_is_acknowledged_not_requeued(
    redis: Transport, redis_client: Any, start_worker: Any, queue: str
) -> None:
    import redis as redis_py

    from tests.support.workerapp import probe

    result = probe.apply_async(("late",), budget=0.5)
    time.sleep(1.0)
    start_worker(redis)
    refusal_of(result)
    time.sleep(0.5)  # the ack follows the result write
    with redis_py.Redis.from_url(redis.broker_url) as store:
        assert store.llen(queue) == 0
        assert unacked_of(store, queue) == []


def test_claim_refuses_a_message_whose_remaining_budget_is_below_the_reserve(
    redis: Transport, redis_client: Any, start_worker: Any
) -> None:
    # a pure rule (tests/unit/test_task.py proves it on a fake clock): one transport
    from tests.support.workerapp import reserved

    # reserve=60: allowed at enqueue; the worker starts 1.5 s later: less than the reserve
    # is left, but some is for a minute (a worker slow to start on a loaded machine)
    result = reserved.apply_async(budget=61.5)
    time.sleep(1.5)
    start_worker(redis)
    refusal = refusal_of(result)
    assert (refusal.gate, refusal.reason) == ("claim", "insufficient_budget")


def test_retry_reservation_exceeding_the_remaining_budget_is_rejected(
    shared_redis_client: Any,
) -> None:
    # a pure rule (tests/unit/test_task.py proves it on a fake clock): one transport
    from tests.support.workerapp import flaky

    result = flaky.apply_async(budget=5)
    refusal = refusal_of(result)
    assert (refusal.gate, refusal.reason) == ("retry", "retry_budget_exhausted")
    # at least one backoff (1 s) fitted; the refused one really did not fit
    assert "ProviderDown('attempt 0')" not in refusal.detail
    needed, left = (
        float(x) for x in re.findall(r"needs ([\d.]+) s .* but ([\d.]+) s left", refusal.detail)[0]
    )
    assert needed > left
    # the run ends when the retry is refused, not when a doomed retry would expire: the
    # worker refused it (its own clock reading) with time still left before the deadline
    assert refusal.deadline_at is not None
    assert refusal.clock_read_at < refusal.deadline_at


def test_a_retry_keeps_the_same_absolute_deadline(shared_client: Any) -> None:
    from celery.signals import after_task_publish

    from tests.support.workerapp import manual_retry

    stamped: list[dict[str, Any]] = []

    def record(headers: dict[str, Any] | None = None, **_: Any) -> None:
        stamped.append(dict(headers or {}))

    after_task_publish.connect(record, weak=False)
    try:
        result = manual_retry.apply_async((0.3,), budget=8)
    finally:
        after_task_publish.disconnect(record)
    seen = result.get(timeout=20)
    # the attempt that succeeded is the retry, published by the worker 0.3 s later ...
    assert seen["retries"] == 1
    # ... and it ran under the instant stamped at the first publish, not a new one
    assert seen["deadline"] == stamped[0][DEADLINE_HEADER]
    # the first message goes without Celery's expires (the claim gate judges it); the
    # retry waits for its countdown, so it carries the same instant as expires too
    assert stamped[0].get("expires") is None
    assert datetime.fromisoformat(seen["expires"]).timestamp() == stamped[0][DEADLINE_HEADER]
    assert seen["source"] == "call"


def test_a_deadline_reaches_children_grandchildren_groups_chords_chains_and_links(
    shared_client: Any,
) -> None:
    from tests.support.workerapp import app, fan_out

    parent = fan_out.apply_async(budget=30).get(timeout=20)
    deadline = parent["deadline"]

    def seen(task_id: str) -> dict[str, Any]:
        # a result backend without push (the filesystem's) is polled: every 0.05 s, not 0.5
        value: dict[str, Any] = app.AsyncResult(task_id).get(timeout=20, interval=0.05)
        return value

    children = parent["children"]
    for path in ("delay", "apply_async", "send_task", "signature_set", "chain_first", "chain_last"):
        assert seen(children[path])["deadline"] == deadline, path
        assert seen(children[path])["origin"] == parent["id"], path
    assert seen(children["plain"])["deadline"] == deadline
    assert seen(children["plain"])["expires"] is not None
    grandchild = seen(children["grandchild"])
    assert grandchild["deadline"] == deadline
    assert seen(grandchild["grandchild"])["deadline"] == deadline
    for member in children["group"] + children["chord_header"]:
        assert seen(member)["deadline"] == deadline
    body = seen(children["chord_body"])
    assert body["deadline"] == deadline
    assert all(member["deadline"] == deadline for member in body["members"])
    linked: Any = app.AsyncResult(children["link"])
    linked.get(timeout=20)
    assert [seen(child.id)["deadline"] for child in linked.children or []] == [deadline]


def test_a_childs_own_budget_can_shorten_the_parents_deadline_but_never_extend_it(
    shared_redis_client: Any,
) -> None:
    from tests.support.workerapp import app, fan_out

    def parent_and_child(child_budget: float, parent_budget: float) -> tuple[Any, Any]:
        parent = fan_out.apply_async((child_budget,), budget=parent_budget).get(timeout=20)
        return parent, app.AsyncResult(parent["children"]["apply_async"]).get(timeout=20)

    parent, longer = parent_and_child(600, parent_budget=20)
    assert (longer["deadline"], longer["source"]) == (parent["deadline"], "parent")  # clamped
    parent, shorter = parent_and_child(5, parent_budget=60)
    assert shorter["deadline"] < parent["deadline"]  # kept
    assert shorter["source"] == "call"


def test_a_child_whose_publisher_forged_a_later_deadline_header_keeps_its_parents_deadline(
    shared_redis_client: Any,
) -> None:
    from tests.support.workerapp import app, forger

    parent = forger.apply_async(budget=20).get(timeout=20)
    children = {
        path: app.AsyncResult(task_id).get(timeout=20)
        for path, task_id in parent["children"].items()
    }
    assert {path: child["deadline"] for path, child in children.items()} == dict.fromkeys(
        children, parent["deadline"]
    )
    assert {children["send_task"]["source"], children["apply_async"]["source"]} == {"parent"}
    # Each child measured its remaining time at its own start, so only the budget bounds it.
    assert children["send_task"]["remaining"] <= 20


def test_an_errback_inherits_the_deadline_of_the_task_that_failed(
    shared_redis_client: Any,
) -> None:
    from tests.support.workerapp import link_error_parent, probe

    errback = probe.si("errback").set(task_id=f"errback-{uuid.uuid4().hex[:10]}")
    failing = link_error_parent.apply_async(budget=30, link_error=errback)
    with pytest.raises(Exception, match="always"):
        failing.get(timeout=20)
    seen = shared_redis_client.AsyncResult(errback.id).get(timeout=20)
    assert seen["deadline"] is not None
    assert seen["source"] == "parent"


def test_the_attempt_is_killed_at_the_deadline_not_at_its_own_longer_time_limit(
    shared_redis_client: Any,
) -> None:
    from tests.support.workerapp import deadline_sleeper

    result = deadline_sleeper.apply_async((30,), budget=2.5, time_limit=60)
    with pytest.raises(TimeLimitExceeded) as killed:
        result.get(timeout=20)
    # the worker reports the hard limit it enforced: the budget left when the attempt
    # was handed to the pool (at most the 2.5 s budget), not the task's 60 s
    enforced = float(killed.value.args[0])
    assert 0 < enforced <= 2.5


def test_a_capped_soft_limit_lets_the_task_clean_up_before_the_deadline(
    shared_redis_client: Any,
) -> None:
    from tests.support.workerapp import cleanup

    seen = cleanup.apply_async((30,), budget=3).get(timeout=20)
    # soft 50 s / hard 60 s capped to the budget left when the attempt was handed to the
    # pool: the soft limit at 5/6 of it, the hard one at the deadline
    interrupted_after, remaining = seen["interrupted_after"], seen["remaining"]
    assert interrupted_after is not None
    # the budget the task started with, on its own monotonic clock (at most the 3 s)
    started_with = remaining + interrupted_after
    assert started_with <= 3
    # interrupted before the deadline: the task still had time left to clean up ...
    assert remaining > 0
    # ... about a sixth of its budget: the soft limit never fires before 5/6 of it (the
    # tolerance is the pool's hand-over, a thirtieth of the budget), only later if busy
    assert remaining <= started_with / 6 + 3 / 30


@pytest.mark.parametrize(
    "header",
    ["garbage", float("inf"), -5.0, 1e300, "2026-11-29T12:00:00", [1.0], {"at": 1}, True],
    ids=["string", "infinity", "negative", "absurd", "naive-iso", "list", "dict", "bool"],
)
def test_a_malformed_deadline_header_is_refused_and_the_worker_keeps_working(
    shared_redis_client: Any, header: object
) -> None:
    # one worker for all eight: each refusal leaves it working for the next header too
    from tests.support.workerapp import probe

    bad = shared_redis_client.send_task("t.probe", ("bad",), headers={DEADLINE_HEADER: header})
    refusal = refusal_of(bad)
    assert (refusal.gate, refusal.reason) == ("claim", "invalid_deadline")
    good = probe.apply_async(("good",), budget=10)
    assert good.get(timeout=20)["label"] == "good"


def test_a_wall_clock_jump_backward_mid_attempt_creates_no_extra_time(
    shifted_client: tuple[Any, Path], tmp_path: Path
) -> None:
    from tests.support.workerapp import watch_remaining

    _, shift = shifted_client
    started = tmp_path / "started"
    result = watch_remaining.apply_async((2.0,), {"started_file": str(started)}, budget=20)
    wait_for(started.exists, 20)
    time.sleep(0.5)  # the delay under test: part of the attempt runs on the true clock
    shift_wall_clock(shift, -3600)  # the worker's wall clock jumps back an hour mid-attempt
    samples = result.get(timeout=20)["samples"]
    assert_wall_changed_mid_attempt(samples, by=-3600)
    assert_monotonic_budget(samples)
    assert samples[-1][1] < 18.5


@pytest.mark.parametrize("offset", [+3.0, -3.0], ids=["worker-ahead", "worker-behind"])
def test_a_worker_with_a_skewed_wall_clock_still_enforces_on_its_monotonic_clock(
    shifted_client: tuple[Any, Path], tmp_path: Path, offset: float
) -> None:
    from tests.support.workerapp import watch_remaining

    _, shift = shifted_client
    shift_wall_clock(shift, offset)
    started = tmp_path / "started"
    published = time.monotonic()
    result = watch_remaining.apply_async((1.0,), {"started_file": str(started)}, budget=20)
    wait_for(started.exists, 20)
    time.sleep(0.3)  # the delay under test: part of the attempt runs with the first skew
    shift_wall_clock(shift, -offset * 10)  # and the skew changes during the attempt
    samples = result.get(timeout=20)["samples"]
    waited = time.monotonic() - published
    assert_wall_changed_mid_attempt(samples, by=-offset * 11)
    # the skew shows once, when the absolute deadline becomes a local budget: 20 s less
    # the offset, less the time the message took from the publish to the first sample
    # (at most what this test waited, less the task's own sampling after it)
    first = samples[0][1]
    sampling = samples[-1][0] - samples[0][2]
    assert 20 - offset - (waited - sampling) <= first <= 20 - offset + 0.01
    # ... and never again: from there on the budget runs down on the monotonic clock
    assert_monotonic_budget(samples)


def assert_monotonic_budget(samples: list[list[float]]) -> None:
    """remaining() must fall exactly as fast as monotonic time passes, whatever the wall does.

    Each sample is (monotonic seconds before the call, remaining(), seconds after it, the
    worker's wall clock): remaining() plus the instant it read its clock is one constant,
    and that instant lies between the readings before and after the call. So the
    constant lies in every sample's [remaining + before, remaining + after]: all of those
    intervals must overlap (a task paused by a busy machine widens one interval; it never
    makes a right answer fail). The tolerance is rounding to microseconds.
    """
    lowest = max(before + remaining for before, remaining, _, _ in samples)
    highest = min(after + remaining for _, remaining, after, _ in samples)
    assert lowest <= highest + 1e-4, (lowest, highest)


def assert_wall_changed_mid_attempt(samples: list[list[float]], by: float) -> None:
    """The worker's wall clock moved by about ``by`` seconds between two samples: the
    change happened during the attempt, with samples on either side of it."""
    walls = [wall for _, _, _, wall in samples]
    steps = [later - earlier for earlier, later in itertools.pairwise(walls)]
    assert any(abs(step - by) < abs(by) / 2 for step in steps), steps


def test_a_chord_started_in_a_scope_shares_one_deadline(shared_client: Any) -> None:
    from celery import chord

    from celery_deadlines import deadline_scope
    from tests.support.workerapp import collect, probe

    with deadline_scope(budget=30, app=shared_client):
        result = chord([probe.s("a"), probe.s("b")])(collect.s())
    body = result.get(timeout=30)
    deadlines = {body["deadline"], *(member["deadline"] for member in body["members"])}
    assert len(deadlines) == 1
    assert {member["source"] for member in body["members"]} == {"scope"}
    # the body is published by the last member to finish, so it inherits from it
    assert body["source"] == "parent"


def test_a_refused_chord_member_fails_the_chord_instead_of_hanging(
    redis: Transport, redis_client: Any, start_worker: Any
) -> None:
    from celery import chord
    from celery.exceptions import ChordError

    from tests.support.workerapp import collect, probe, reserved

    # Given a chord whose second member needs 60 s of reserve, and a worker 1.5 s late
    member: Any = reserved.si()
    result = chord([probe.s("fine"), member.set(budget=61.5)])(collect.s())
    time.sleep(1.5)
    start_worker(redis)
    # When the worker refuses that member, the caller learns why, at once
    with pytest.raises(DeadlineRefused, match="insufficient_budget"):
        result.get(timeout=20)
    # and the chord's body is failed too: nothing is left waiting
    body = wait_for(lambda: result.backend.get_task_meta(result.id)["status"] != "PENDING", 10)
    assert body
    meta = result.backend.get_task_meta(result.id)
    assert meta["status"] == "FAILURE"
    assert isinstance(meta["result"], ChordError)
