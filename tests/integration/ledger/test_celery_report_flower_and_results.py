"""A run the library ends reads as ended in the tools beside Celery (issue 30, items 1-2).

Real components only: a prefork ``celery worker`` (two processes, task events on, the
run ledger on PostgreSQL, reconciling every second), a real Flower process read through
its HTTP API (``/api/task/info/<id>``: what Flower built from the worker's task
events), and the result as it is stored with ``result_extended`` on: the Redis
backend's ``celery-task-meta-<id>``, or django-celery-results' ``TaskResult`` row
(``django-db``), which its admin shows.

1. A run the ledger ends (the sweeper expires it while it waits behind busy pool
   processes; an attempt ends UNKNOWN) is shown by Flower in a state that says so, never
   RECEIVED or STARTED forever, and its stored result names the task, its arguments,
   the worker and the queue as Celery's own failure store does.
2. A run Celery itself ended in the worker (the caller's ``expires`` passed on a run
   with no deadline, or the caller revoked it) keeps the outcome Celery stored
   (REVOKED): the ledger records it as ended, and the sweeper never replaces it with a
   ``DeadlineRefused`` that says no worker took the message. With a budget, an earlier
   ``expires`` is the run's deadline: the claim gate refuses the late message once,
   and that outcome is never replaced either.

Waits are polls bounded by the budgets and intervals below; an assertion is on what was
observed (states seen, instants recorded), never on a sleep.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from celery import states
from celery.exceptions import TaskRevokedError
from celery.utils.saferepr import saferepr

from celery_deadlines.models import TERMINAL, Run, Status
from tests.integration.conftest import (
    LEDGER_DB,
    REDIS,
    _reset_connections,
    forget_unacked,
    ledger_database_url,
    redis_transport,
    require,
)
from tests.support import isolation
from tests.support.flowerprocess import FlowerProcess
from tests.support.processes import Transport, WorkerProcess, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("postgres"),
    pytest.mark.django_db(transaction=True, databases=[LEDGER_DB]),
]

#: The state Flower shows for a run whose effect's outcome is unknown, once the library
#: sends its event for it: ``task-unknown`` (celery.events.state makes an event type it
#: has no state for into the state of its upper-cased name, and ranks that state above
#: STARTED and RECEIVED, below SUCCESS and FAILURE: a later settlement still wins). The
#: same word the caller's AsyncResult shows (rules/states.CALLER_UNKNOWN).
UNKNOWN_IN_FLOWER = "UNKNOWN"
#: The workers' reconcile interval and lease (seconds): the sweeper's pace.
RECONCILE_INTERVAL = 1.0
LEASE_TTL = 2.0
#: Margin for a loaded two-core machine, on top of every interval waited for.
SLACK = 10.0

#: Result backends: Redis (``celery-task-meta-<id>``) or django-celery-results' table.
BACKENDS = ["redis", "django-db"]


# -- what the result backend stored -------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """A result as stored, in the words both backends share (``queue``: Redis only,
    django-celery-results has no column for it; ``None`` there)."""

    status: str
    result: Any
    name: str | None
    args: Any
    kwargs: Any
    worker: str | None
    queue: str | None


def stored_in_redis(task_id: str) -> Stored | None:
    import redis as redis_py

    with redis_py.Redis.from_url(isolation.REDIS_RESULTS) as client:
        raw = client.get(f"celery-task-meta-{task_id}")
    if raw is None:
        return None
    meta = json.loads(raw)
    return Stored(
        meta["status"],
        meta.get("result"),
        meta.get("name"),
        meta.get("args"),
        meta.get("kwargs"),
        meta.get("worker"),
        meta.get("queue"),
    )


def stored_in_dcr(task_id: str) -> Stored | None:
    from django_celery_results.models import TaskResult

    row = TaskResult.objects.using(LEDGER_DB).filter(task_id=task_id).first()
    if row is None:
        return None
    return Stored(
        row.status,
        json.loads(row.result) if row.result else None,
        row.task_name,
        row.task_args,
        row.task_kwargs,
        row.worker,  # type: ignore[attr-defined]  # a column since 2.1; not in the stubs
        None,
    )


def published_as(backend: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """``args`` and ``kwargs`` as Celery's own store writes them for a worker's request:
    decoded from the message (Redis), or the message's ``argsrepr``/``kwargsrepr``
    encoded by the result serializer (django-celery-results)."""
    if backend == "redis":
        return json.loads(json.dumps(list(args))), kwargs
    return json.dumps(saferepr(args)), json.dumps(saferepr(kwargs))


# -- the worker, Flower and the client ----------------------------------------------


@dataclass
class Beside:
    """One test's worker, the module's Flower, and the client app publishing to them."""

    backend: str
    queue: str
    worker: WorkerProcess
    flower: FlowerProcess
    tasks: Any  # tests.support.flowerapp

    def stored(self, task_id: str) -> Stored | None:
        return stored_in_redis(task_id) if self.backend == "redis" else stored_in_dcr(task_id)

    def flower_state(self, task_id: str) -> str | None:
        return self.flower.state_of(task_id)

    def warm_up(self) -> str:
        """Run a plain task through the worker until Flower shows it done: the worker's
        events reach Flower (its event queue is bound), and Celery's own store has named
        the worker. Returns the worker's name as Celery's own store wrote it.

        A probe sent before Flower's event queue was bound is never seen by Flower: one
        more is sent every few seconds until one is."""
        give_up = time.monotonic() + 30
        while True:
            probe = self.tasks.nap.apply_async((0,))
            try:
                wait_for(lambda sent=probe.id: self.flower_state(sent) == states.SUCCESS, 5)
                break
            except TimeoutError:
                if time.monotonic() > give_up:
                    raise TimeoutError("Flower saw none of the probes in 30 s") from None
        own = wait_for(lambda: self.stored(probe.id), 10)
        assert own.worker, f"Celery's own store named no worker: {own}"
        return str(own.worker)

    def stored_final(self, task_id: str) -> Stored | None:
        """The result as stored, once it holds a final state."""
        stored = self.stored(task_id)
        return stored if stored is not None and stored.status in states.READY_STATES else None

    def occupy_both_processes(self, seconds: float) -> list[str]:
        """Two plain tasks that sleep ``seconds``, once Flower shows both STARTED."""
        naps = [self.tasks.nap.apply_async((seconds,)) for _ in range(2)]
        wait_for(lambda: all(self.flower_state(n.id) == states.STARTED for n in naps), 20)
        return [n.id for n in naps]


@pytest.fixture(scope="module")
def flower(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlowerProcess]:
    """Flower, watching the task events of this session's Redis broker (each test's
    worker publishes its events there, whatever its queue)."""
    transport = redis_transport()
    require(transport)
    folder = tmp_path_factory.mktemp("flower")
    process = FlowerProcess(transport, folder / "flower.log").start()
    yield process
    process.kill()


@pytest.fixture
def beside(
    request: pytest.FixtureRequest, tmp_path: Path, queue: str, flower: FlowerProcess
) -> Iterator[Callable[[str], Beside]]:
    """``beside(backend)``: a worker (prefork, two processes, events on, the ledger on
    PostgreSQL) whose results go to ``backend``, ready, and the client app."""
    from tests.support import flowerapp

    app = flowerapp.app
    saved = {
        key: app.conf[key]
        for key in ("broker_url", "result_backend", "task_default_queue", "deadlines_database")
    }
    started: list[WorkerProcess] = []

    def start(backend: str) -> Beside:
        redis = redis_transport()
        results = isolation.REDIS_RESULTS if backend == "redis" else "django-db"
        transport = Transport("redis", redis.broker_url, results, *REDIS)
        worker = WorkerProcess(
            transport,
            queue,
            tmp_path / f"worker-{len(started)}.log",
            concurrency=2,
            app_module="tests.support.flowerapp",
            node=f"{queue}-{len(started)}",
            extra_env={
                "TEST_DATABASE_URL": ledger_database_url(),
                "DJANGO_SETTINGS_MODULE": "tests.support.flower_settings",
                "TEST_RECONCILE_INTERVAL": str(RECONCILE_INTERVAL),
                "TEST_LEASE_TTL": str(LEASE_TTL),
            },
        )
        started.append(worker)
        worker.start()
        # the client reads results from Redis; a django-db worker's are read from its
        # table (TaskResult, on the ledger's database) by the test itself
        app.conf.update(
            broker_url=redis.broker_url,
            result_backend=isolation.REDIS_RESULTS,
            task_default_queue=queue,
            deadlines_database=LEDGER_DB,
        )
        _reset_connections(app)
        return Beside(backend, queue, worker, flower, flowerapp)

    offset = len(flower.log())
    yield start
    for worker in started:
        worker.kill()
    forget_unacked(redis_transport().broker_url, queue)
    app.conf.update(saved)
    _reset_connections(app)
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for worker in started:
            print(f"--- {worker.log_path.name} ---\n{worker.log()}")
        print(f"--- flower.log (this test's lines) ---\n{flower.log()[offset:]}")


def run_of(task_id: str) -> Run | None:
    return Run.objects.using(LEDGER_DB).filter(task_id=task_id).first()


def flower_terminal(beside: Beside, task_id: str, timeout: float) -> dict[str, Any]:
    """Flower's task info once its state is one of Celery's ready states; on timeout,
    fails with the state Flower still shows."""
    seen: list[str | None] = []

    def terminal() -> dict[str, Any] | None:
        info = beside.flower.task_info(task_id)
        state = None if info is None else info["state"]
        if not seen or seen[-1] != state:
            seen.append(state)
        return info if info is not None and state in states.READY_STATES else None

    try:
        found: dict[str, Any] = wait_for(terminal, timeout, interval=0.1)
    except TimeoutError:
        pytest.fail(
            f"Flower shows {seen[-1]} for {task_id} {timeout:.0f} s on, not a ready state "
            f"(states seen: {seen}; info: {beside.flower.task_info(task_id)})"
        )
    return found


# -- 1. a run the sweeper expires in the backlog ---------------------------------------

#: The run's budget, and how long the two pool processes stay busy: long enough for the
#: sweeper (every RECONCILE_INTERVAL) to expire the run while it waits in the worker.
BACKLOG_BUDGET = 1.5
BACKLOG_BUSY = BACKLOG_BUDGET + RECONCILE_INTERVAL + 4.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_the_sweeper_expires_in_a_workers_backlog_is_ended_in_flower_and_named_in_its_result(
    beside: Callable[[str], Beside], backend: str
) -> None:
    tools = beside(backend)
    worker_name = tools.warm_up()
    naps = tools.occupy_both_processes(BACKLOG_BUSY)
    args, kwargs = (7,), {"note": "backlog"}
    task_id = f"backlog-{uuid.uuid4().hex[:10]}"
    tools.tasks.step.apply_async(args, kwargs, task_id=task_id, budget=BACKLOG_BUDGET)

    # the sweeper ends it while both processes are still busy: it waited in the backlog
    run = wait_for(
        lambda: (r := run_of(task_id)) is not None and r.is_terminal and r,
        BACKLOG_BUDGET + RECONCILE_INTERVAL + SLACK,
    )
    busy = [tools.flower_state(n) for n in naps]
    assert busy == [states.STARTED, states.STARTED], (
        f"the premise: both pool processes still busy when the run ended ({busy})"
    )
    assert (run.status, run.reason, run.attempt) == (Status.EXPIRED, "deadline_passed", 0)

    # Flower: a ready state, not RECEIVED (with a Revoke button) forever
    info = flower_terminal(tools, task_id, BACKLOG_BUSY + RECONCILE_INTERVAL + SLACK)
    assert info["received"] is not None  # Flower saw the worker receive it
    assert info["name"] == "f.step"

    # the stored result: the same ended state, named as Celery's own store names a run
    stored = wait_for(lambda: tools.stored(task_id), 10)
    assert stored.status == info["state"], (stored, info["state"])
    assert stored.status in states.READY_STATES
    expected_args, expected_kwargs = published_as(backend, args, kwargs)
    named = (stored.name, stored.args, stored.kwargs, stored.worker)
    assert named == ("f.step", expected_args, expected_kwargs, worker_name), stored
    if backend == "redis":
        assert stored.queue == tools.queue, stored


# -- 1. an UNKNOWN run ----------------------------------------------------------------

#: How the effect's outcome is lost: the pool process dies after the call (the
#: reconciler marks the run UNKNOWN once the lease lapses), or the provider's reply
#: times out (the attempt ends it UNKNOWN itself). Neither task has a reconciler.
UNKNOWN_CASES = [("killed", "redis"), ("reply_lost", "redis"), ("killed", "django-db")]


@pytest.mark.parametrize(("lost", "backend"), UNKNOWN_CASES)
def test_an_unknown_run_is_shown_by_flower_as_unknown_not_started_forever(
    beside: Callable[[str], Beside], lost: str, backend: str
) -> None:
    tools = beside(backend)
    worker_name = tools.warm_up()
    key = f"pay-{uuid.uuid4().hex[:10]}"
    task = tools.tasks.pay_then_die if lost == "killed" else tools.tasks.pay_reply_lost
    task_id = f"unknown-{lost}-{uuid.uuid4().hex[:10]}"
    task.apply_async((key,), task_id=task_id, budget=60)

    wait_for(
        lambda: (r := run_of(task_id)) is not None and r.status == Status.UNKNOWN,
        LEASE_TTL + 2 * RECONCILE_INTERVAL + SLACK,
    )
    seen: list[str | None] = []

    def left_started() -> str | None:
        state = tools.flower_state(task_id)
        if not seen or seen[-1] != state:
            seen.append(state)
        return state if state not in (None, states.RECEIVED, states.STARTED) else None

    try:
        shown = wait_for(left_started, 2 * RECONCILE_INTERVAL + SLACK, interval=0.1)
    except TimeoutError:
        pytest.fail(
            f"Flower still shows {seen[-1]} for the UNKNOWN run {task_id} (states seen: {seen})"
        )
    assert shown == UNKNOWN_IN_FLOWER, f"states seen: {seen}"
    info = tools.flower.task_info(task_id)
    assert info is not None
    assert info["started"] is not None  # it did start, then this
    assert Run.objects.using(LEDGER_DB).get(task_id=task_id).status == Status.UNKNOWN

    # the stored UNKNOWN names the run as Celery's own store would
    stored = wait_for(lambda: tools.stored(task_id), 10)
    assert stored.status == "UNKNOWN"
    expected_args, expected_kwargs = published_as(backend, (key,), {})
    named = (stored.name, stored.args, stored.kwargs, stored.worker)
    assert named == (task.name, expected_args, expected_kwargs, worker_name), stored
    if backend == "redis":
        assert stored.queue == tools.queue, stored


# -- 2. a run Celery ended keeps Celery's outcome -------------------------------------

#: The caller's ``expires``, the task's budget, and how long both pool processes stay
#: busy: beyond ``expires``, so that the message is still waiting in the worker when it
#: passes, and a revoke reaches the worker before a process frees up (well before the
#: budget ends).
CELERY_EXPIRES = 2.0
ENDED_BUDGET = 8.0
ENDED_BUSY = CELERY_EXPIRES + 2.0


@dataclass(frozen=True)
class Ending:
    """How a run waiting in the worker is ended, and what each tool says of it: the
    state Celery stores (and Flower shows), the caller's error, the ledger's
    ``(status, reason)``: what it is, never a refusal that says no worker took it."""

    options: dict[str, Any]
    revoke: bool
    stored: str
    error: type[Exception]
    ledger: tuple[str, str]


#: Celery itself ends the run: its own ``expires`` passes (a run with no deadline), or
#: the caller revokes it (``app.control.revoke``); Celery stores REVOKED either way and
#: sends ``task-revoked``. With a budget, an earlier ``expires`` is the run's deadline
#: (item 3): the claim gate refuses the late message, as for a shorter budget, and tells
#: its caller and Flower what Celery tells of an expired message; the ledger keeps the
#: reason.
ENDINGS = {
    "expires": Ending(
        {"expires": CELERY_EXPIRES},
        False,
        states.REVOKED,
        TaskRevokedError,
        (Status.EXPIRED, "expired_by_celery"),
    ),
    "revoke": Ending(
        {"budget": ENDED_BUDGET},
        True,
        states.REVOKED,
        TaskRevokedError,
        (Status.FAILED, "revoked_by_celery"),
    ),
    "expires-as-deadline": Ending(
        {"expires": CELERY_EXPIRES, "budget": ENDED_BUDGET},
        False,
        states.REVOKED,
        TaskRevokedError,
        (Status.EXPIRED, "deadline_passed"),
    ),
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_ended_while_it_waits_in_the_worker_keeps_its_first_outcome_in_every_tool(
    beside: Callable[[str], Beside], backend: str
) -> None:
    """Each ending's run waits behind both busy pool processes at once (one wait for
    the sweeper to pass their budget, for all three)."""
    tools = beside(backend)
    tools.warm_up()
    tools.occupy_both_processes(ENDED_BUSY)
    results = {}
    for ended_by, ending in ENDINGS.items():
        task_id = f"{ended_by}-{uuid.uuid4().hex[:10]}"
        results[ended_by] = tools.tasks.step.apply_async((3,), task_id=task_id, **ending.options)
        if ending.revoke:
            tools.tasks.app.control.revoke(task_id)  # flagged now, discarded at the hand-off
    # A canary no worker consumes, whose deadline comes two reconcile intervals after
    # the runs' budget: once the sweeper has expired it and told its caller, the sweeper
    # has passed the runs' budget (a pass expires every run past its deadline at once).
    canary_queue = isolation.queue_name(f"canary-{uuid.uuid4().hex[:10]}")
    canary_id = f"canary-{uuid.uuid4().hex[:10]}"
    tools.tasks.step.apply_async(
        (0,), task_id=canary_id, queue=canary_queue, budget=ENDED_BUDGET + 2 * RECONCILE_INTERVAL
    )
    try:
        if backend == "redis":
            for ended_by, result in results.items():
                with pytest.raises(ENDINGS[ended_by].error):
                    result.get(timeout=ENDED_BUSY + SLACK)
        first = {
            ended_by: wait_for(
                lambda task_id=result.id: tools.stored_final(task_id), ENDED_BUSY + SLACK
            )
            for ended_by, result in results.items()
        }
        assert {e: s.status for e, s in first.items()} == {e: n.stored for e, n in ENDINGS.items()}

        # watch the stored outcomes until the sweeper has passed the runs' budget (the
        # canary's end), and two intervals more: none ever changes
        outcomes = {
            result.id: {(first[e].status, json.dumps(first[e].result, sort_keys=True))}
            for e, result in results.items()
        }
        give_up = time.monotonic() + ENDED_BUDGET + 2 * RECONCILE_INTERVAL + SLACK
        watch_until: float | None = None
        while watch_until is None or time.monotonic() < watch_until:
            for task_id, seen in outcomes.items():
                now = tools.stored(task_id)
                assert now is not None
                seen.add((now.status, json.dumps(now.result, sort_keys=True)))
                assert len(seen) == 1, f"the stored final state was replaced: {seen}"
            if watch_until is None and tools.stored(canary_id) is not None:
                watch_until = time.monotonic() + 2 * RECONCILE_INTERVAL
            assert time.monotonic() < give_up, "the sweeper never expired the canary"
            time.sleep(0.1)
        canary = run_of(canary_id)
        assert canary is not None
        # the premise: the sweeper did pass the runs' budget
        assert (canary.status, canary.reason) == (Status.EXPIRED, "deadline_passed")
    finally:
        import redis as redis_py

        with redis_py.Redis.from_url(redis_transport().broker_url) as client:
            client.delete(canary_queue)  # the canary's message, never consumed

    for ended_by, result in results.items():
        ending = ENDINGS[ended_by]
        assert tools.flower_state(result.id) == ending.stored  # as the result says
        run = run_of(result.id)
        assert run is not None
        assert run.status in TERMINAL, f"{ended_by}: the ledger says {run.status} ({run.reason})"
        assert (run.status, run.reason) == ending.ledger
        assert run.attempt == 0  # never claimed: Celery discarded the message
