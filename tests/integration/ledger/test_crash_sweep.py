"""The deterministic crash-point sweep (reliability plan S1), judged by an external oracle.

Every named crash point of :mod:`celery_deadlines.ledger._crashpoints` is hit by its own run,
which dies there exactly once: its pool process (``kill``) or its whole worker
(``kill_worker``) is SIGKILLed, with ``task_reject_on_worker_lost`` off and on. The
runs pay through a provider in a process of its own (``tests/support/sink.py``) whose
append-only log is the only count of side effects; one key loses the provider's reply
(*ack loss*). Two real workers (prefork, 2 processes each, acks_late), Redis and
PostgreSQL; a worker that dies is restarted, as a supervisor would.

After quiescence the checker (:mod:`tests.support.oracle`) must find nothing lost,
stuck, duplicated, unexpected, unexplained or mismatched, and every planned crash must
have fired. Each point runs twice per batch; ``CELERY_DEADLINES_SOAK=1`` runs it ten
times.

Pool-process kills run in concurrent batches of 8 runs (a killed pool process takes only
its own run down). Whole-worker kills run one run at a time, so that every run meets the
crash planned for it and not a neighbour's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from celery_deadlines.ledger._crashpoints import PLAN_FILE_ENV, POINTS
from celery_deadlines.models import TERMINAL, Run, RunEvent, Status
from tests.integration.conftest import LEDGER_DB, ledger_database_url
from tests.support import oracle
from tests.support.processes import REPO, Transport, WorkerProcess, wait_for

#: One xdist worker runs the sweep, one case after another, as a single process did: with
#: two sweeps at once (a pool-kill sweep beside the whole-worker-kill sweep), a
#: redelivered run's pool process hung from its claim to the hard time limit, twice in
#: four runs (not yet explained; never seen with one process).
pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("postgres"),
    pytest.mark.django_db(transaction=True, databases=[LEDGER_DB]),
    pytest.mark.xdist_group("crash-sweep"),
]
DB = LEDGER_DB

TRIALS = 10 if os.environ.get("CELERY_DEADLINES_SOAK") else 2
TTL = 2.0

#: Points a pool process dies at, in the order a run meets them.
WORKER_POINTS = (
    "claim.before", "claim.after", "effect.intent", "effect.dispatched",
    "effect.before_outcome", "effect.recorded", "run.completed",
)  # fmt: skip
RETRY_POINTS = ("retry.reserved", "retry.published")
PRODUCER_POINTS = ("outbox.recorded", "outbox.published")
#: The reconciler dies between the provider's answer and writing it (worker main process).
RECONCILER_POINT = "reconcile.answered"
#: A worker dies whole at these points, under the runs of the other processes too.
WORKER_KILL_POINTS = (
    "claim.after", "effect.dispatched", "effect.before_outcome", "effect.recorded",
)  # fmt: skip

#: Every run of the sweep has budget to spare: the only acceptable end is success.
ALLOWED = frozenset({("SUCCEEDED", "")})


def test_the_sweep_covers_every_named_crash_point() -> None:
    covered = {*WORKER_POINTS, *RETRY_POINTS, *PRODUCER_POINTS, RECONCILER_POINT}
    assert covered == set(POINTS)


@dataclass(frozen=True)
class Case:
    """One run of the sweep: where it dies, how, and how it is published."""

    point: str | None
    action: str = "kill"
    ack_loss: bool = False
    retry_first: bool = False
    producer: bool = False


def kill_cases() -> list[Case]:
    return [
        *(Case(point) for point in WORKER_POINTS),
        *(Case(point, retry_first=True) for point in RETRY_POINTS),
        *(Case(point, producer=True) for point in PRODUCER_POINTS),
        Case(None, ack_loss=True),
    ]


def worker_kill_cases() -> list[Case]:
    return [
        *(Case(point, "kill_worker") for point in WORKER_KILL_POINTS),
        Case(RECONCILER_POINT, "kill_worker", ack_loss=True),
    ]


@pytest.fixture
def sweep(
    tmp_path: Path,
    queue: str,
    redis_broker: Transport,
    ledger_client: Any,
    ledger_worker: Any,
    provider: tuple[str, Path],
) -> Callable[[list[Case], str, int], None]:
    """Run ``cases`` (each ``TRIALS`` times) with ``reject_on_worker_lost``, ``batch``
    runs at a time, then judge."""
    url, provider_log = provider
    plan_file = tmp_path / "crashplan.json"
    knobs = {
        PLAN_FILE_ENV: str(plan_file),
        "TEST_SINK_URL": url,
        "TEST_ACKS_LATE": "1",
        "TEST_VISIBILITY_TIMEOUT": "5",
        "TEST_LEASE_TTL": str(TTL),
        "TEST_REPUBLISH_AFTER": "3",
        "TEST_MAX_LOST_LEASES": "5",
        "TEST_DATABASE_URL": ledger_database_url(),
    }
    tasks = ledger_client(redis_broker)

    def run(cases: list[Case], reject_on_worker_lost: str, batch: int) -> None:
        trials = [(case, n) for n in range(TRIALS) for case in cases]
        planned: list[tuple[Case, oracle.Planned]] = []
        plan: dict[str, list[dict[str, str]]] = {}
        for case, n in trials:
            task_id = f"sweep-{case.point or 'none'}-{case.action}-{n}-{uuid.uuid4().hex[:8]}"
            key = ("ackloss-" if case.ack_loss else "pay-") + task_id
            if case.point is not None:
                plan[task_id] = [{"point": case.point, "action": case.action}]
            planned.append((case, oracle.Planned(task_id, key, case.point)))
        plan_file.write_text(json.dumps(plan))
        env = {**knobs, "TEST_REJECT_ON_WORKER_LOST": reject_on_worker_lost}
        workers = ledger_worker.together(2, redis_broker, concurrency=2, **env)
        restart = partial(ledger_worker, redis_broker, concurrency=2, **env)
        acknowledged: dict[str, bool] = {}
        for start in range(0, len(planned), batch):
            for case, run_plan in planned[start : start + batch]:
                if case.producer:
                    acknowledged[run_plan.task_id] = produce(run_plan, redis_broker, queue, env)
                else:
                    tasks.sweep_pay.apply_async(
                        (run_plan.key,), {"retry_first": case.retry_first},
                        task_id=run_plan.task_id, budget=90,
                    )  # fmt: skip
                    acknowledged[run_plan.task_id] = True
            in_flight = [run_plan for _, run_plan in planned[start : start + batch]]
            quiesce(in_flight, workers, restart, still_for=0)
        runs = [
            oracle.Planned(p.task_id, p.key, p.point, acknowledged[p.task_id]) for _, p in planned
        ]
        quiesce(runs, workers, restart)
        calls = read_jsonl(provider_log)
        fired = read_jsonl(Path(f"{plan_file}.fired.jsonl"))
        verdict = oracle.check(runs, ledgered(runs), calls, fired, ALLOWED)
        print(f"sweep: {len(runs)} runs, {len(fired)} crashes fired, {len(calls)} provider calls")
        assert verdict.violations() == {}
        for case, run_plan in planned:
            expect_recovery(case, run_plan)

    return run


def produce(run: oracle.Planned, transport: Transport, queue: str, env: dict[str, str]) -> bool:
    """Publish from a producer process of its own (it may die at a producer point)."""
    child_env = {
        **os.environ, **transport.env(), **env, "TEST_QUEUE": queue,
        "DJANGO_SETTINGS_MODULE": "tests.support.ledger_settings",
        "TEST_SINK": os.devnull,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.sweep_producer", run.task_id, run.key],
        cwd=REPO, env=child_env, capture_output=True, text=True, timeout=60,
        start_new_session=True,  # a crash plan's kill_worker must not reach pytest
    )  # fmt: skip
    if done.returncode not in (0, -signal.SIGKILL):
        raise RuntimeError(f"producer failed ({done.returncode}):\n{done.stderr}")
    return "acknowledged" in done.stdout


def quiesce(
    runs: list[oracle.Planned],
    workers: list[WorkerProcess],
    restart: Callable[[], WorkerProcess],
    timeout: float = 150.0,
    still_for: float = 2 * TTL,
) -> None:
    """Wait until every run ended and nothing moved for ``still_for`` (two lease TTLs:
    the reconciler ran several passes meanwhile); restart any worker that died, like a
    supervisor."""
    ids = [run.task_id for run in runs]
    deadline = time.monotonic() + timeout
    last: Any = None
    still_since = time.monotonic()
    while True:
        for index, worker in enumerate(workers):
            if worker.process is not None and worker.process.poll() is not None:
                workers[index] = restart()
        rows = Run.objects.using(DB).filter(task_id__in=ids)
        snapshot = sorted(rows.values_list("task_id", "status", "version"))
        done = len(snapshot) == len(ids) and all(status in TERMINAL for _, status, _ in snapshot)
        if snapshot != last or not done:
            last, still_since = snapshot, time.monotonic()
        elif time.monotonic() - still_since >= still_for:
            return
        if time.monotonic() > deadline:
            pending = [entry for entry in snapshot if entry[1] not in TERMINAL]
            raise TimeoutError(f"no quiescence within {timeout} s; not ended: {pending}")
        time.sleep(0.2)


def ledgered(runs: list[oracle.Planned]) -> dict[str, oracle.Ledgered]:
    found: dict[str, oracle.Ledgered] = {}
    for run in Run.objects.using(DB).filter(task_id__in=[r.task_id for r in runs]):
        effect = run.effects.first()
        found[run.task_id] = oracle.Ledgered(
            run.status, run.reason, run.is_terminal,
            effect.state if effect else None, effect.lease_token if effect else None,
        )  # fmt: skip
    return found


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def expect_recovery(case: Case, run: oracle.Planned) -> None:
    """How each point must have been recovered (reliability plan S1's extra asserts)."""
    events = list(RunEvent.objects.using(DB).filter(run__task_id=run.task_id))
    kinds = [(event.kind, event.outcome) for event in events]
    effect = Run.objects.using(DB).get(task_id=run.task_id).effects.get()
    where = f"{run.task_id}: {kinds}"
    # The run goes UNKNOWN before its effect is asked about. The effect itself is marked
    # UNKNOWN by the reconciler that settled the lapsed lease, unless another worker's
    # reconciler settled the effect first (it may, once the run is UNKNOWN; the soak saw
    # it: reconcile, effect_not_dispatched, reconciled, and the mark then had nothing to do).
    went_unknown = any(e.status == Status.UNKNOWN and e.outcome == "applied" for e in events)
    effect_marked_or_settled = ("effect_unknown", "applied") in kinds or any(
        kind in kinds
        for kind in (("effect_not_dispatched", "applied"), ("effect_succeeded", "applied"))
    )
    if case.point == "effect.dispatched":
        # killed with the call not made: UNKNOWN, reconciled as not found, sent once
        assert went_unknown, where
        assert effect_marked_or_settled, where
        assert ("effect_not_dispatched", "applied") in kinds, where
        assert effect.dispatches == 2, where
    if case.point == "effect.before_outcome" or case.ack_loss:
        # the call was made, its outcome lost: UNKNOWN, reconciled as found, never resent
        assert went_unknown, where
        assert effect_marked_or_settled, where
        assert effect.dispatches == 1, where
        assert str(effect.evidence).startswith("provider lookup: 1 call"), where
    if case.point == "run.completed":
        # the redelivery (or the lapsed lease) changes nothing: no claim after the end
        claims = [kind for kind in kinds if kind == ("claim", "applied")]
        assert len(claims) == 1, where
    if case.point in {"outbox.recorded", "retry.reserved"}:
        assert ("republish", "applied") in kinds, where  # the sweeper published it
    if case.point == "claim.after":
        assert Run.objects.using(DB).get(task_id=run.task_id).lost_leases == 1, where
    if case.point == "reconcile.answered":
        assert kinds.count(("effect_succeeded", "applied")) == 1, where  # answered once


@pytest.mark.parametrize("reject_on_worker_lost", ["0", "1"], ids=["ack-on-loss", "reject-on-loss"])
def test_a_pool_process_killed_at_every_crash_point_leaves_one_effect_per_key(
    sweep: Callable[[list[Case], str, int], None], reject_on_worker_lost: str
) -> None:
    sweep(kill_cases(), reject_on_worker_lost, 8)


def test_a_whole_worker_killed_at_the_effect_points_or_in_its_reconciler_leaves_one_effect(
    sweep: Callable[[list[Case], str, int], None],
) -> None:
    sweep(worker_kill_cases(), "1", 1)


# -- reliability plan S5: a pool process paused past its lease --------------------------


@pytest.mark.parametrize("point", ["claim.after", "effect.intent"])
def test_a_worker_paused_past_its_lease_before_the_guard_never_reaches_the_provider(
    tmp_path: Path,
    redis_broker: Transport,
    ledger_client: Any,
    ledger_worker: Any,
    provider: tuple[str, Path],
    point: str,
) -> None:
    url, provider_log = provider
    plan_file = tmp_path / "crashplan.json"
    task_id = f"paused-{point}-{uuid.uuid4().hex[:8]}"
    key = f"pay-{task_id}"
    # paused for 4 lease TTLs: the other worker's reconciler takes the run over meanwhile
    plan_file.write_text(json.dumps({task_id: {"point": point, "action": "stop:4"}}))
    knobs = {
        PLAN_FILE_ENV: str(plan_file), "TEST_SINK_URL": url, "TEST_ACKS_LATE": "1",
        "TEST_LEASE_TTL": "1",
    }  # fmt: skip
    tasks = ledger_client(redis_broker)
    ledger_worker.together(2, redis_broker, **knobs)
    result = tasks.sweep_pay.apply_async((key,), task_id=task_id, budget=60)
    assert result.get(timeout=30)["id"].startswith(key)  # the other worker paid
    [paused] = read_jsonl(Path(f"{plan_file}.fired.jsonl"))
    # the paused process resumes, tries to go on with token 1, and is refused; paused at
    # the guard, by the guard (its heartbeat thread resumes with it, and its refused
    # renewal may be recorded first: the two threads' order is the scheduler's)
    refused_by = "dispatch" if point == "effect.intent" else None
    wait_for(
        lambda: [
            e for e in RunEvent.objects.using(DB).filter(run__task_id=task_id)
            if e.outcome == "rejected" and e.lease_token == 1
            and refused_by in (None, e.kind)
        ],
        30,
    )  # fmt: skip
    calls = [call for call in read_jsonl(provider_log) if call["key"] == key]
    assert len(calls) == 1  # only the current holder called
    assert calls[0]["token"] > 1
    assert paused["pid"] not in {call["pid"] for call in calls}
    run = Run.objects.using(DB).get(task_id=task_id)
    assert (run.status, run.effects.get().lease_token) == ("SUCCEEDED", calls[0]["token"])
