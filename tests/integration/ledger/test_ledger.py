"""The run ledger with real workers, a real broker and PostgreSQL (seed 000's fixtures).

Each test starts ``celery worker`` subprocesses of ``tests.support.ledgerapp`` against
the PostgreSQL test database, publishes from this process, and judges the outcome from
two independent sources: the ledger (runs and their events) and the sink file the task
bodies append to (the oracle: one line per start and per effect, duplicates visible).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from django.db import connections, transaction

from celery_deadlines import DeadlineRefused, PerformedPastDeadline
from celery_deadlines.models import Run, RunEvent, Status
from tests.integration.conftest import LEDGER_DB, ended, provider_calls
from tests.support.processes import Transport, shift_wall_clock, wait_for
from tests.support.proxy import Proxy

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("postgres"),
    pytest.mark.django_db(transaction=True, databases=[LEDGER_DB]),
]

DB = LEDGER_DB


def lines(sink: Path, kind: str | None = None, key: str | None = None) -> list[dict[str, Any]]:
    if not sink.exists():
        return []
    found = [json.loads(line) for line in sink.read_text().splitlines() if line]
    return [
        line
        for line in found
        if (kind is None or line["kind"] == kind) and (key is None or line["key"] == key)
    ]


def run_of(task_id: str) -> Run:
    return Run.objects.using(DB).get(task_id=task_id)


def history(task_id: str) -> list[tuple[str, str, int]]:
    return [
        (e.kind, e.outcome, e.lease_token)
        for e in RunEvent.objects.using(DB).filter(run__task_id=task_id)
    ]


def pool_pid(run: Run) -> int:
    return int(run.owner.rsplit(":", 1)[1])


# -- the happy path, and the outbox -------------------------------------------------------


def test_a_run_is_recorded_before_publish_claimed_once_and_completed_under_its_token(
    broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path
) -> None:
    tasks = ledger_client(broker)
    ledger_worker(broker)
    result = tasks.effect.apply_async(("order-1",), budget=30)
    assert result.get(timeout=30) == {"key": "order-1", "token": 1}
    run = run_of(result.id)
    assert (run.status, run.reason, run.attempt, run.lease_token) == (Status.SUCCEEDED, "", 1, 1)
    assert run.deadline is not None
    assert run.checkpoint_name == "before-effect"
    assert history(result.id) == [
        ("enqueue", "applied", 0),
        ("claim", "applied", 1),
        ("checkpoint", "applied", 1),
        ("succeeded", "applied", 1),
    ]
    assert len(lines(sink, "effect", "order-1")) == 1


def test_a_publish_inside_a_transaction_waits_for_the_commit_and_a_rollback_sends_nothing(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path
) -> None:
    tasks = ledger_client(redis_broker)
    ledger_worker(redis_broker)
    sent: list[Any] = []

    def failing_request() -> None:
        with transaction.atomic(using=DB):
            sent.append(tasks.effect.delay("rolled-back"))
            raise RuntimeError("the request failed")

    with pytest.raises(RuntimeError):
        failing_request()
    [rolled_back] = sent
    with transaction.atomic(using=DB):
        committed = tasks.effect.delay("committed")
        assert run_of(committed.id).status == Status.QUEUED
    assert committed.get(timeout=30)["key"] == "committed"
    assert not Run.objects.using(DB).filter(task_id=rolled_back.id).exists()
    assert lines(sink, key="rolled-back") == []


def test_a_message_the_broker_lost_is_published_again_from_the_outbox(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path, queue: str
) -> None:
    tasks = ledger_client(redis_broker)
    result = tasks.effect.apply_async(("lost",), budget=60)
    redis.Redis.from_url(redis_broker.broker_url).delete(queue)  # the broker lost it
    ledger_worker(redis_broker, TEST_REPUBLISH_AFTER="1")
    assert result.get(timeout=30)["key"] == "lost"
    assert ("republish", "applied", 0) in history(result.id)
    assert len(lines(sink, "effect", "lost")) == 1


def test_a_lost_message_whose_deadline_passes_unclaimed_expires_as_deadline_passed(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path, queue: str
) -> None:
    tasks = ledger_client(redis_broker)
    result = tasks.effect.apply_async(("too-late",), budget=1)
    redis.Redis.from_url(redis_broker.broker_url).delete(queue)
    wait_for(lambda: Run.objects.using(DB).filter(task_id=result.id).exists(), 5)
    ledger_worker(redis_broker)
    run = wait_for(lambda: ended(result.id), 30)
    # the sweeper's words are the claim gate's: one status and one reason per situation
    assert (run.status, run.reason) == (Status.EXPIRED, "deadline_passed")
    with pytest.raises(DeadlineRefused) as refused:
        result.get(timeout=30)
    assert (refused.value.gate, refused.value.reason) == ("claim", "deadline_passed")
    assert lines(sink, key="too-late") == []


def test_a_lost_message_whose_expires_was_its_deadline_is_told_revoked_as_celery_tells_it(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path, queue: str
) -> None:
    from celery.exceptions import TaskRevokedError

    tasks = ledger_client(redis_broker)
    result = tasks.effect.apply_async(("expires-too-late",), budget=60, expires=1)
    redis.Redis.from_url(redis_broker.broker_url).delete(queue)
    wait_for(lambda: Run.objects.using(DB).filter(task_id=result.id).exists(), 5)
    ledger_worker(redis_broker)
    run = wait_for(lambda: ended(result.id), 30)
    assert (run.status, run.reason) == (Status.EXPIRED, "deadline_passed")  # the ledger's words
    with pytest.raises(TaskRevokedError, match="expired"):  # Celery's, for its caller
        result.get(timeout=30)
    assert result.state == "REVOKED"
    assert lines(sink, key="expires-too-late") == []


# -- a message for another task, under a run's id --------------------------------------


def as_it_is(task_id: str) -> tuple[Any, ...]:
    run = run_of(task_id)
    return (run.status, run.owner, run.lease_token, run.version, run.attempt, run.updated_at)


def test_a_message_for_another_task_under_a_queued_runs_id_runs_nothing_and_the_run_runs_after(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path, queue: str
) -> None:
    tasks = ledger_client(redis_broker)
    worker = ledger_worker(redis_broker)
    waiting = f"{queue}-victim"  # the worker does not consume it yet: the run stays QUEUED
    victim = tasks.effect.apply_async(("victim",), budget=60, queue=waiting)
    before = as_it_is(victim.id)
    assert before[0] == Status.QUEUED
    # Celery's own publish of another task's message with the victim's id
    tasks.app.send_task("l.other", ("forged",), task_id=victim.id)
    refused = wait_for(
        lambda: (
            RunEvent.objects.using(DB)
            .filter(run__task_id=victim.id, kind="claim", outcome="rejected")
            .first()
        ),
        30,
    )
    assert refused.detail == "task_mismatch:l.other"
    assert as_it_is(victim.id) == before
    assert victim.state == "PENDING"  # nothing stored under the victim's id
    assert lines(sink) == []  # l.other's body never started
    tasks.app.control.add_consumer(
        waiting, destination=[f"{queue}-0@{socket.gethostname()}"], reply=True, timeout=10
    )
    assert victim.get(timeout=30) == {"key": "victim", "token": 1}
    assert history(victim.id) == [
        ("enqueue", "applied", 0),
        ("claim", "rejected", 0),
        ("claim", "applied", 1),
        ("checkpoint", "applied", 1),
        ("succeeded", "applied", 1),
    ]
    assert [line["key"] for line in lines(sink, "start")] == ["victim"]
    # the worker is still consuming its own queue
    assert tasks.effect.apply_async(("after",), budget=30).get(timeout=30)["key"] == "after"
    assert "refused at claim gate: task_mismatch" in worker.log()


# -- seed 000 fixture 5: two workers, one claim ---------------------------------------


def test_the_same_task_id_published_three_times_runs_once(
    broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path
) -> None:
    tasks = ledger_client(broker)
    ledger_worker.together(2, broker)
    first = tasks.effect.apply_async(("dup",), task_id="dup-1", budget=60, countdown=1)
    for _ in range(2):  # duplicate messages (apply_async again would publish nothing)
        tasks.app.send_task("l.effect", ("dup",), task_id="dup-1", budget=60, countdown=1)
    assert first.get(timeout=30)["key"] == "dup"
    wait_for(lambda: len([e for e in history("dup-1") if e[0] == "claim"]) == 3, 30)
    claims = [e for e in history("dup-1") if e[0] == "claim"]
    assert sorted(outcome for _, outcome, _ in claims) == ["applied", "rejected", "rejected"]
    assert len(lines(sink, "start", "dup")) == 1
    assert len(lines(sink, "effect", "dup")) == 1


def test_a_task_outliving_the_redis_visibility_timeout_runs_once_not_once_per_worker(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path
) -> None:
    tasks = ledger_client(redis_broker)
    knobs = {"TEST_ACKS_LATE": "1", "TEST_VISIBILITY_TIMEOUT": "1", "TEST_LEASE_TTL": "1.5"}
    ledger_worker.together(2, redis_broker, **knobs)
    result = tasks.effect.apply_async(("long",), kwargs={"seconds": 6}, budget=60)
    assert result.get(timeout=60)["key"] == "long"
    events = history(result.id)
    renewals = [e for e in events if e[:2] == ("renew", "applied")]
    refused = [e for e in events if e[:2] == ("claim", "rejected")]
    assert len(renewals) >= 3, events  # the lease was kept alive by the heartbeat
    assert refused, f"Redis redelivered nothing within 6 s: {events}"
    assert len(lines(sink, "start", "long")) == 1
    assert len(lines(sink, "effect", "long")) == 1


# -- seed 000 fixture 1: a paused worker wakes after its lease lapsed --------------------


def test_a_paused_worker_that_wakes_after_its_lease_lapsed_cannot_write(
    broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path
) -> None:
    tasks = ledger_client(broker)
    # acks_late: the paused worker's unacked message fills its prefetch window, so the
    # broker hands the republished message to the other worker
    knobs = {"TEST_LEASE_TTL": "1", "TEST_ACKS_LATE": "1"}
    ledger_worker(broker, **knobs)
    result = tasks.effect.apply_async(("paused",), kwargs={"seconds": 1.5}, budget=60)
    running = wait_for(lambda: run_of(result.id).status == Status.RUNNING and run_of(result.id), 30)
    paused = pool_pid(running)
    os.kill(paused, signal.SIGSTOP)
    try:
        ledger_worker(broker, **knobs)  # its reconciler re-leases the run; it runs it
        wait_for(lambda: len(lines(sink, "effect", "paused")) == 1, 30)
    finally:
        os.kill(paused, signal.SIGCONT)
    # the reconciler's requeue fenced token 1 at once (token 2); the new claim took 3
    assert result.get(timeout=30)["token"] == 3
    rejected = wait_for(
        lambda: [e for e in history(result.id) if e[1] == "rejected" and e[2] == 1], 30
    )
    assert rejected[0][0] in {"checkpoint", "renew"}
    effects = lines(sink, "effect", "paused")
    assert [e["token"] for e in effects] == [3]
    assert paused not in {e["pid"] for e in effects}
    assert run_of(result.id).status == Status.SUCCEEDED


# -- seed 000 fixture 2: the wall clock moves backward during renewals ------------------


def test_a_wall_clock_moved_backward_never_extends_a_lease(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, tmp_path: Path
) -> None:
    tasks = ledger_client(redis_broker)
    shift = tmp_path / "shift"
    shift.write_text("0")
    ledger_worker(
        redis_broker,
        TEST_LEASE_TTL="1.5",
        CELERY_DEADLINES_TESTING_WALL_CLOCK_SHIFT_FILE=str(shift),
    )
    result = tasks.effect.apply_async(("rewound",), kwargs={"seconds": 3}, budget=60)
    wait_for(lambda: run_of(result.id).status == Status.RUNNING, 30)
    shift_wall_clock(shift, -3600)  # an NTP step back by an hour, mid-attempt
    result.get(timeout=30)
    assert not RunEvent.objects.using(DB).filter(run__task_id=result.id, outcome="rejected")
    renewals = RunEvent.objects.using(DB).filter(
        run__task_id=result.id, kind="renew", outcome="applied"
    )
    assert renewals.count() >= 3
    for event in renewals:
        assert event.lease_expires_at is not None
        granted = (event.lease_expires_at - event.at).total_seconds()
        assert 0 < granted <= 1.5, (event.at, event.lease_expires_at)


# -- seed 001: a worker clock beyond the skew budget takes no new work ------------------


def skewable_worker(
    ledger_worker: Any, transport: Transport, tmp_path: Path, **env: str
) -> tuple[Any, Path]:
    """A ledger worker with a 0.5 s skew budget, and the file its wall clock is shifted
    by (seconds; 0 at start): write to it to step the worker's clock."""
    shift = tmp_path / "shift"
    shift.write_text("0")
    worker = ledger_worker(
        transport,
        TEST_CLOCK_SKEW_BUDGET="0.5",
        CELERY_DEADLINES_TESTING_WALL_CLOCK_SHIFT_FILE=str(shift),
        **env,
    )
    return worker, shift


@pytest.mark.parametrize("jump", [600, -600], ids=["clock-jumps-forward", "clock-jumps-backward"])
def test_a_worker_whose_clock_leaves_the_skew_budget_takes_no_new_work_until_it_agrees(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, tmp_path: Path, jump: int
) -> None:
    tasks = ledger_client(redis_broker)
    worker, shift = skewable_worker(ledger_worker, redis_broker, tmp_path)
    assert tasks.effect.apply_async(("before",), budget=60).get(timeout=30)["key"] == "before"
    shift_wall_clock(shift, jump)  # an NTP step, or a VM resumed with a stale clock
    wait_for(lambda: "clock uncertain: offset" in worker.log(), 10)
    held = tasks.effect.apply_async(("held",), budget=60)
    time.sleep(2)  # long enough for a silent dispatch to show itself: it must not happen
    assert run_of(held.id).status == Status.QUEUED
    shift_wall_clock(shift, 0)
    wait_for(lambda: "clock back within the skew budget" in worker.log(), 10)
    assert held.get(timeout=30)["key"] == "held"  # consumed again, with its own deadline


def test_a_worker_that_cannot_read_the_ledgers_clock_dispatches_nothing_until_it_can(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path
) -> None:
    # seed 001's "NTP becomes unavailable" row: the authority clock (the database) is
    # unreachable from this worker only; it says so and takes no work, it never guesses
    tasks = ledger_client(redis_broker)
    database = connections[DB].settings_dict
    with Proxy((database["HOST"] or "127.0.0.1", int(database["PORT"] or 5432))) as proxy:
        url = f"postgres://{database['USER']}@127.0.0.1:{proxy.port}/{database['NAME']}"
        worker = ledger_worker(redis_broker, TEST_DATABASE_URL=url, TEST_CLOCK_SKEW_BUDGET="0.5")
        assert tasks.effect.apply_async(("before",), budget=60).get(timeout=30)["key"] == "before"
        proxy.block()
        wait_for(
            lambda: "clock uncertain: the ledger's clock could not be read" in worker.log(), 15
        )
        held = tasks.effect.apply_async(("held",), budget=60)  # recorded by this process
        time.sleep(2)  # long enough for a silent dispatch to show itself: it must not happen
        assert (run_of(held.id).status, lines(sink, "start", "held")) == (Status.QUEUED, [])
        proxy.unblock()
        wait_for(lambda: "clock back within the skew budget" in worker.log(), 20)
        assert held.get(timeout=30)["key"] == "held"
    assert len(lines(sink, "effect", "held")) == 1


def test_a_message_that_reaches_a_pool_process_first_is_held_as_clock_uncertain_not_run(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, tmp_path: Path, sink: Path
) -> None:
    # the clock watch measures once per reconcile pass (here: hourly); a message received
    # before it notices a step is judged by the ledger's time as the watch estimates it
    # (monotonic time since its last reading), and the claim's own reading holds the run
    tasks = ledger_client(redis_broker)
    worker, shift = skewable_worker(
        ledger_worker, redis_broker, tmp_path, TEST_RECONCILE_INTERVAL="3600"
    )
    assert tasks.effect.apply_async(("before",), budget=60).get(timeout=30)["key"] == "before"
    shift_wall_clock(shift, 600)
    held = tasks.effect.apply_async(("held",), budget=60)
    wait_for(lambda: ("clock_hold", "applied", 1) in history(held.id), 15)
    assert lines(sink, "start", "held") == []  # never started
    # the claim measured the 600 s step, within the uncertainty it reports (the reading
    # is a measurement: -599.999 s +/- 0.002 s is right, and so is -600.001 s)
    [(offset, uncertainty)] = re.findall(
        r"held as CLOCK_UNCERTAIN: clock offset ([-+][\d.]+) s \(\+/- ([\d.]+) s\)", worker.log()
    )
    assert abs(float(offset) + 600) <= float(uncertainty) + 0.001  # printed to the ms
    assert "refused" not in worker.log()  # not failed, not expired
    wait_for(lambda: "clock uncertain: offset" in worker.log(), 10)  # the watch woke up
    shift_wall_clock(shift, 0)
    # the worker's clock agrees again: it consumes, and publishes the held run again
    assert held.get(timeout=30)["key"] == "held"
    run = run_of(held.id)
    assert (run.status, run.attempt, run.lease_token) == (Status.SUCCEEDED, 2, 2)
    assert len(lines(sink, "effect", "held")) == 1
    assert "clock back within the skew budget" in worker.log()


# -- pool processes killed mid-run, workers restarted ---------------------------------


@pytest.mark.parametrize(
    ("acks_late", "reject_on_worker_lost"), [("0", "0"), ("1", "0"), ("1", "1")]
)
def test_a_pool_process_killed_mid_run_loses_no_run_and_resumes_from_its_checkpoint(
    redis_broker: Transport,
    ledger_client: Any,
    ledger_worker: Any,
    sink: Path,
    acks_late: str,
    reject_on_worker_lost: str,
) -> None:
    tasks = ledger_client(redis_broker)
    ledger_worker(
        redis_broker, TEST_ACKS_LATE=acks_late, TEST_REJECT_ON_WORKER_LOST=reject_on_worker_lost
    )
    task_id = f"crash-{uuid.uuid4().hex[:8]}"
    with states_told_to_the_caller(redis_broker, task_id) as told:
        result = tasks.crash_first.apply_async(("crash",), task_id=task_id, budget=60)
        run = wait_for(lambda: ended(result.id), 45)
        assert result.get(timeout=15) == "crash"
    assert (run.status, run.attempt, run.lost_leases) == (Status.SUCCEEDED, 2, 1)
    assert len(lines(sink, "start", "crash")) == 2
    assert len(lines(sink, "effect", "crash")) == 1
    # the caller is never told of a failure (Celery's WorkerLostError) for a run the
    # ledger recovers: every state it was sent is true
    assert told[-1] == "SUCCESS"
    assert "FAILURE" not in told, told


@contextmanager
def states_told_to_the_caller(
    transport: Transport, task_id: str, until: str = "SUCCESS"
) -> Iterator[list[str]]:
    """Every state the result backend sends to a waiting ``get()`` (Redis publishes each
    one on the task's channel), collected until the block ends (read up to ``until``)."""
    client = redis.Redis.from_url(transport.result_backend)
    channel = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call,unused-ignore]
    channel.subscribe(f"celery-task-meta-{task_id}")
    told: list[str] = []
    try:
        yield told
        stop = time.monotonic() + 2  # what was sent before the block ended, read out
        while time.monotonic() < stop:
            message = channel.get_message(timeout=0.2)
            if message is None:
                continue
            meta = json.loads(message["data"])
            told.append(meta["status"])
            if told[-1] == until:
                break
    finally:
        channel.close()
        client.close()


@pytest.mark.parametrize("reject_on_worker_lost", ["0", "1"])
def test_a_task_that_always_kills_its_process_fails_as_worker_lost_instead_of_looping(
    redis_broker: Transport,
    ledger_client: Any,
    ledger_worker: Any,
    sink: Path,
    reject_on_worker_lost: str,
) -> None:
    tasks = ledger_client(redis_broker)
    ledger_worker(
        redis_broker,
        TEST_ACKS_LATE="1",
        TEST_REJECT_ON_WORKER_LOST=reject_on_worker_lost,
        TEST_MAX_LOST_LEASES="2",
        # each loss is found when the dead attempt's lease lapses: a short lease (the
        # body dies at once, nothing needs renewing) makes the three rounds quicker
        TEST_LEASE_TTL="1",
    )
    result = tasks.always_crash.apply_async(("doomed",), budget=120)
    run = wait_for(lambda: ended(result.id), 60)
    assert (run.status, run.reason) == (Status.FAILED, "worker_lost")
    time.sleep(3)  # long enough for a loop to show itself: the count must not move
    assert len(lines(sink, "start", "doomed")) == 3


def test_a_worker_restarted_after_the_deadline_does_not_resurrect_the_run(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path
) -> None:
    tasks = ledger_client(redis_broker)
    knobs = {"TEST_ACKS_LATE": "1", "TEST_VISIBILITY_TIMEOUT": "2", "TEST_LEASE_TTL": "1"}
    first = ledger_worker(redis_broker, **knobs)
    result = tasks.effect.apply_async(("restart",), kwargs={"seconds": 30}, budget=3)
    wait_for(lambda: run_of(result.id).status == Status.RUNNING, 30)
    first.kill()  # the whole worker dies; its message is unacked, its lease held
    deadline = run_of(result.id).deadline
    assert deadline is not None
    wait_for(lambda: ended(result.id) is None and _db_now() > deadline, 10)
    ledger_worker(redis_broker, **knobs)
    run = wait_for(lambda: ended(result.id), 30)
    assert (run.status, run.reason) == (Status.EXPIRED, "deadline_passed")
    with pytest.raises(DeadlineRefused):
        result.get(timeout=30)
    time.sleep(3)  # Redis redelivers the unacked message meanwhile: it must not start
    assert len(lines(sink, "start", "restart")) == 1


def _db_now() -> Any:
    with connections[DB].cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


# -- hard time limits: the worker ends the attempt it supervised ------------------------


def test_a_hard_time_limit_at_the_deadline_ends_the_run_as_expired(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path
) -> None:
    tasks = ledger_client(redis_broker)
    ledger_worker(redis_broker)
    result = tasks.effect.apply_async(("capped",), kwargs={"seconds": 30}, budget=2)
    run = wait_for(lambda: ended(result.id), 30)
    assert (run.status, run.reason) == (Status.EXPIRED, "deadline_passed")
    assert run.lease_token == 2  # the killed process's token 1 is fenced
    with pytest.raises(Exception, match="TimeLimitExceeded"):
        result.get(timeout=10)
    assert len(lines(sink, "start", "capped")) == 1
    assert lines(sink, "effect", "capped") == []


def test_a_tasks_own_hard_time_limit_fails_the_run_without_a_rerun(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path
) -> None:
    tasks = ledger_client(redis_broker)
    ledger_worker(redis_broker)
    result = tasks.limited.apply_async(("limited", 10), budget=60)
    run = wait_for(lambda: ended(result.id), 30)
    assert (run.status, run.reason) == (Status.FAILED, "time_limit")
    time.sleep(2)  # a reconciler pass or two: the run must not be requeued
    assert len(lines(sink, "start", "limited")) == 1


# -- the effect ledger: seed 000 fixtures 3 and 4 ---------------------------------------


@pytest.mark.parametrize("crash", ["before", "after"], ids=["fixture-3", "fixture-4"])
def test_a_pool_process_killed_around_the_call_performs_the_effect_exactly_once(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path, crash: str
) -> None:
    tasks = ledger_client(redis_broker)
    ledger_worker(redis_broker, TEST_ACKS_LATE="1")
    result = tasks.pay.apply_async((f"pay-{crash}",), {"crash": crash}, budget=60)
    run = wait_for(lambda: ended(result.id), 45)
    assert run.status == Status.SUCCEEDED
    assert len(lines(sink, "effect", f"pay-{crash}")) == 1  # the oracle: one call
    effect = run.effects.get()
    assert effect.state == "SUCCEEDED"
    kinds = [kind for kind, _, _ in history(result.id)]
    assert "effect_unknown" in kinds  # the ambiguous dispatch was reconciled, not resent
    if crash == "after":
        assert effect.evidence == "sink lookup: found"
        assert result.get(timeout=10) == {"paid": "pay-after", "reconciled": True}
    else:
        assert effect.evidence == "sink lookup: no call"
        assert effect.dispatches == 2


# -- the window no library closes alone: a pause between the guard and the call ---------


@pytest.mark.parametrize("fenced", [False, True], ids=["plain-provider", "fencing-provider"])
def test_a_worker_paused_between_the_guard_and_the_call_is_stopped_only_by_a_fencing_provider(
    redis_broker: Transport,
    ledger_client: Any,
    ledger_worker: Any,
    sink: Path,
    provider: tuple[str, Path],
    fenced: bool,
) -> None:
    url, log = provider
    key = ("fenced-" if fenced else "plain-") + "order-42"
    tasks = ledger_client(redis_broker)
    knobs = {"TEST_ACKS_LATE": "1", "TEST_LEASE_TTL": "1", "TEST_SINK_URL": url}
    ledger_worker.together(2, redis_broker, **knobs)
    result = tasks.remote_pay.apply_async((key,), budget=60)
    guarded = wait_for(lambda: lines(sink, "guarded", key), 30)[0]
    os.kill(guarded["pid"], signal.SIGSTOP)  # past the guard, before the call
    try:
        run = wait_for(lambda: ended(result.id), 45)  # reconciled, dispatched again by B
    finally:
        os.kill(guarded["pid"], signal.SIGCONT)
    assert run.status == Status.SUCCEEDED
    stale = wait_for(lambda: [c for c in provider_calls(log, key) if c["token"] == 1], 15)
    accepted = [c for c in provider_calls(log, key) if c["outcome"] == "accepted"]
    if fenced:
        assert stale[0]["outcome"] == "refused"  # the provider closes the window
        assert len(accepted) == 1
    else:
        assert stale[0]["outcome"] == "accepted"  # the window: a late second call
        assert len(accepted) == 2
    assert accepted[0]["token"] > 1  # the run's outcome is the current holder's call
    effect = Run.objects.using(DB).get(task_id=result.id).effects.get()
    assert (effect.state, effect.lease_token) == ("SUCCEEDED", accepted[0]["token"])
    refused_outcome = wait_for(
        lambda: [e for e in history(result.id) if e[1] == "rejected" and e[2] == 1], 15
    )
    assert refused_outcome  # the stale holder's outcome is not the record


def test_a_deadline_that_expires_during_the_provider_call_records_the_outcome_not_a_guess(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path
) -> None:
    tasks = ledger_client(redis_broker)
    ledger_worker(redis_broker)
    task_id = f"slow-{uuid.uuid4().hex[:8]}"
    with states_told_to_the_caller(redis_broker, task_id, until="FAILURE") as told:
        result = tasks.slow_pay.apply_async(("slow",), task_id=task_id, budget=2)
        run = wait_for(lambda: ended(result.id), 30)
        with pytest.raises(DeadlineRefused) as refused:
            result.get(timeout=15)
    # the caller is told UNKNOWN while the call's outcome is unknown, then the settled
    # outcome; never Celery's TimeLimitExceeded first, which a waiting get() would raise
    assert told[-2:] == ["UNKNOWN", "FAILURE"], told
    assert told.count("FAILURE") == 1, told
    effect = run.effects.get()
    # the call was cut by the deadline: UNKNOWN, then reconciled with the provider
    assert (effect.state, effect.evidence) == ("SUCCEEDED", "sink lookup: found")
    # the payment happened after all: the run ended past its deadline after it, and
    # the caller is told so (PerformedPastDeadline, through the result backend's JSON)
    assert (run.status, run.reason) == (Status.EXPIRED, "performed_past_deadline")
    assert isinstance(refused.value, PerformedPastDeadline)  # not resurrected
    kinds = [kind for kind, _, _ in history(result.id)]
    assert "effect_unknown" in kinds
    assert len(lines(sink, "effect", "slow")) == 1
