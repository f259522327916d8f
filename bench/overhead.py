"""DeadlineTask vs plain Celery: publish cost per call and end-to-end throughput.

Same broker (Redis), same worker (one ``celery worker`` subprocess, prefork), same
settings, same run; the two variants alternate in ABBA order round by round so that
drift on this shared machine hits both alike. Prints medians and the ratios the issue
sets goals for:

* publish overhead (µs per ``apply_async``): DeadlineTask minus plain, measured on Redis
  with the two variants paired call by call (one round trip is ~130 µs here, so this
  is noisy), and the library's own code timed alone with Celery's publish stubbed;
* end-to-end throughput (tasks/s from the first publish to the last task done):
  DeadlineTask / plain, goal >= 0.97;
* the worker alone: a queue filled first, then handed to the worker (``add_consumer``),
  timed between two marker tasks on the worker's clock.

Usage: python bench/overhead.py [--tasks 2000] [--rounds 7] [--calls 3000]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
QUEUE = f"bench-{uuid.uuid4().hex[:8]}"
WORKER_NAME = f"{QUEUE}@bench"
os.environ["BENCH_QUEUE"] = QUEUE

from bench import benchapp  # noqa: E402


def start_worker(log: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "celery", "-A", "bench.benchapp", "worker", "-P", "prefork",
        "-c", "2", "-Q", QUEUE, "-l", "WARNING", "-n", WORKER_NAME,
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("wb") as out:
        worker = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    benchapp.sentinel.apply_async(queue=QUEUE).get(timeout=60)  # ready and warm
    return worker


def paired_publish_costs(plain: Any, deadline: Any, calls: int) -> tuple[float, float, float]:
    """Publish both variants alternately, call by call: medians (µs) and median difference.

    Pairing each plain publish with the next DeadlineTask publish cancels the drift of a
    shared machine; the median difference is the overhead a caller pays per call.
    """
    clock = time.perf_counter_ns
    plain_ns, deadline_ns, differences = [], [], []
    for i in range(calls):
        t0 = clock()
        plain.delay(i)
        t1 = clock()
        deadline.delay(i)
        t2 = clock()
        plain_ns.append(t1 - t0)
        deadline_ns.append(t2 - t1)
        differences.append((t2 - t1) - (t1 - t0))
    return (
        statistics.median(plain_ns) / 1e3,
        statistics.median(deadline_ns) / 1e3,
        statistics.median(differences) / 1e3,
    )


def drain_rate(task: Any, tasks: int, round_id: str) -> float:
    """Tasks/s of the worker alone: a queue filled first, then handed to the worker.

    The publisher is idle while the worker drains, so this isolates the worker-side
    cost of the gates (claim, time-limit cap, attempt anchoring) from publish costs.
    """
    import redis

    queue = f"{QUEUE}-drain-{round_id}"
    start, end = f"{queue}:start", f"{queue}:end"
    benchapp.mark.apply_async((start,), queue=queue)
    for i in range(tasks):
        task.apply_async((i,), queue=queue)
    benchapp.mark.apply_async((end,), queue=queue)
    benchapp.app.control.add_consumer(queue, reply=True, destination=[WORKER_NAME])
    with redis.Redis.from_url(benchapp.MARKS_URL) as store:
        elapsed = benchapp.wait_for_mark(store, end, queue) - float(store.get(start) or 0)
        store.delete(start, end)
    benchapp.app.control.cancel_consumer(queue, reply=True, destination=[WORKER_NAME])
    return tasks / elapsed


def library_publish_cost(calls: int) -> float:
    """What ``DeadlineTask.apply_async`` itself costs (µs/call), with Celery's publish stubbed.

    Celery's ``Task.apply_async`` is replaced by a no-op for the measurement, so what is
    left is exactly the work this library adds in front of it (reading settings and
    the clock, inheriting, gating, stamping). The publish hook's cost is added too.
    """
    import celery.app.task
    from celery import Celery

    from celery_deadlines import DeadlineTask
    from celery_deadlines.core.publishing import on_before_task_publish

    app = Celery("bench-library", broker="memory://", set_as_current=False)

    def identity(x: int) -> int:
        return x

    task = app.task(base=DeadlineTask, name="m.deadline", shared=False, budget=300)(identity)
    stamped = {"id": "x", "task": "m.deadline", "x_deadline": 1.0, "x_deadline_source": "call"}
    original = celery.app.task.Task.apply_async
    celery.app.task.Task.apply_async = lambda self, *args, **kwargs: None  # type: ignore[method-assign,assignment]
    try:
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            for i in range(calls):
                task.apply_async((i,))
                on_before_task_publish(sender="m.deadline", headers=stamped, properties={})
            runs.append((time.perf_counter() - started) / calls * 1e6)
    finally:
        celery.app.task.Task.apply_async = original  # type: ignore[method-assign]
    return statistics.median(runs)


def end_to_end(task: Any, tasks: int) -> float:
    """Tasks/s from the first publish until the worker has run them all."""
    started = time.perf_counter()
    for i in range(tasks):
        task.delay(i)
    benchapp.sentinel.delay().get(timeout=600)
    return tasks / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per end-to-end round")
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds per variant")
    parser.add_argument("--calls", type=int, default=3000, help="publishes per cost round")
    args = parser.parse_args()

    log = REPO / "bench" / "results" / "overhead-worker.log"
    log.parent.mkdir(exist_ok=True)
    worker = start_worker(log)
    try:
        paired = [
            paired_publish_costs(benchapp.plain, benchapp.deadline, args.calls)
            for _ in range(args.rounds)
        ]
        benchapp.sentinel.delay().get(timeout=600)  # drain before timing throughput
        plain_e2e: list[float] = []
        deadline_e2e: list[float] = []
        plain_drain: list[float] = []
        deadline_drain: list[float] = []
        for round_no in range(args.rounds):
            # ABBA order: a drift of the shared machine across a round hits both alike
            variants = [
                (benchapp.plain, plain_e2e, plain_drain, "p"),
                (benchapp.deadline, deadline_e2e, deadline_drain, "d"),
            ]
            for task, e2e, drain, tag in variants if round_no % 2 == 0 else variants[::-1]:
                e2e.append(end_to_end(task, args.tasks))
                drain.append(drain_rate(task, args.tasks, f"{tag}{round_no}"))
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(60)
    library = library_publish_cost(args.calls)

    def med(values: list[float]) -> float:
        return statistics.median(values)

    plain_pub = med([p[0] for p in paired])
    deadline_pub = med([p[1] for p in paired])
    overhead = med([p[2] for p in paired])
    ratio = med(deadline_e2e) / med(plain_e2e)
    print(
        f"celery-deadlines overhead benchmark: Redis broker, prefork worker -c 2, "
        f"{args.rounds} alternating rounds"
    )
    print(f"{'measure':<44}{'plain Task':>12}{'DeadlineTask':>14}{'overhead':>12}")
    print(
        f"{'publish on Redis, paired calls (µs/call)':<44}{plain_pub:>12.1f}"
        f"{deadline_pub:>14.1f}{overhead:>+10.1f}µs"
    )
    print(
        f"{'publish, library code alone (µs/call)':<44}{'':>12}{library:>14.1f}{library:>+10.1f}µs"
    )
    print(
        f"{'end to end (tasks/s, median)':<44}{med(plain_e2e):>12.0f}{med(deadline_e2e):>14.0f}"
        f"{ratio:>11.3f}x"
    )
    drain_ratio = med(deadline_drain) / med(plain_drain)
    print(
        f"{'worker alone, queue drain (tasks/s)':<44}{med(plain_drain):>12.0f}"
        f"{med(deadline_drain):>14.0f}{drain_ratio:>11.3f}x"
    )
    paired_e2e = med([d / p for p, d in zip(plain_e2e, deadline_e2e, strict=True)])
    paired_drain = med([d / p for p, d in zip(plain_drain, deadline_drain, strict=True)])
    print(
        f"  each round's DeadlineTask / plain, median (the two ran side by side, so a "
        f"drift of the machine between rounds cancels): end to end {paired_e2e:.3f}x, "
        f"worker alone {paired_drain:.3f}x"
    )
    print(f"  end-to-end rounds, plain:    {[round(x) for x in plain_e2e]}")
    print(f"  end-to-end rounds, deadline: {[round(x) for x in deadline_e2e]}")
    print(f"  drain rounds, plain:         {[round(x) for x in plain_drain]}")
    print(f"  drain rounds, deadline:      {[round(x) for x in deadline_drain]}")
    verdict = "met" if overhead <= 15 and library <= 15 and ratio >= 0.97 else "NOT met"
    print(f"goals (publish overhead <= 15 µs/call, end-to-end ratio >= 0.97): {verdict}")


if __name__ == "__main__":
    main()
