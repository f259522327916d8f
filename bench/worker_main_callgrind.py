"""A real prefork worker's main process, counted in CPU instructions per task.

``bench/worker_instructions.py`` counts the code a worker runs for a message in a loop
of its own, with a stub pool. This runs the real thing: one ``celery worker`` (prefork,
``-c 2``, Redis, ``bench/benchapp.py``) under valgrind's callgrind, the queue filled
first and handed to it, and reads the main process's instruction counter
(``callgrind_control``) before and after each drain. Everything the main process does
for a task is in it: kombu's Redis reads and acknowledgements, the event loop, the
pool's pipes, billiard's per-job timers, Celery's strategy and the request. Counts
repeat to about 0.5 % whatever else the machine runs (wall-clock throughput on a shared
2-core machine moves by 10-30 % from round to round), and the main process is what a
prefork worker's throughput is bound by on such a machine (bench/README.md).

Slow: everything runs 50 times slower under valgrind (about 6 minutes with the
defaults). The pool processes are under valgrind too but not counted.

Usage: python bench/worker_main_callgrind.py [--tasks 400] [--rounds 2] [--against TREE]
Needs valgrind (Debian package ``valgrind``) and Redis (``BENCH_BROKER_URL``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
QUEUE = f"bench-cg-{uuid.uuid4().hex[:8]}"
os.environ["BENCH_QUEUE"] = QUEUE

from bench import benchapp, callgrind  # noqa: E402

_TICKS = itertools.count()

VARIANTS = {"plain": "bench.plain", "deadline": "bench.deadline", "no budget": "bench.nobudget"}


def instructions(pid: int) -> int:
    """The instructions callgrind has counted so far in process ``pid`` (all threads);
    at the smoke size (no valgrind), one more than the last time."""
    if callgrind.SMOKE:
        return next(_TICKS)
    out = subprocess.run(
        ["callgrind_control", "-e", "Ir", str(pid)], capture_output=True, text=True, check=False
    ).stdout
    counts = re.findall(r"Th\s+\d+\s+([\d,]+)", out)
    if not counts:
        raise SystemExit(f"callgrind_control found no counter for {pid}:\n{out}")
    return sum(int(count.replace(",", "")) for count in counts)


def drain(worker: str, pid: int, task_name: str, tasks: int, tag: str) -> float:
    """Main-process instructions per task while the worker drains ``tasks`` of a queue."""
    import redis

    queue = f"{QUEUE}-{tag}"
    end = f"{queue}:end"
    task = benchapp.app.tasks[task_name]
    for number in range(tasks):
        task.apply_async((number,), queue=queue)
    benchapp.mark.apply_async((end,), queue=queue)
    time.sleep(1.0)  # the worker idles: what it counts now is its idle loop, in both
    before = instructions(pid)
    benchapp.app.control.add_consumer(queue, reply=True, destination=[worker], timeout=60)
    with redis.Redis.from_url(benchapp.MARKS_URL) as store:
        benchapp.wait_for_mark(store, end, queue, seconds=3600)
        time.sleep(1.0)  # the last acknowledgements
        after = instructions(pid)
        store.delete(end)
    benchapp.app.control.cancel_consumer(queue, reply=True, destination=[worker], timeout=60)
    return (after - before) / tasks


def count(tree: Path, tasks: int, rounds: int) -> dict[str, float]:
    """Median main-process instructions per task of each variant, in ``tree``'s code."""
    worker = f"{QUEUE}-{tree.name}@bench"
    command = [
        *callgrind.valgrind(),
        sys.executable, "-m", "celery", "-A", "bench.benchapp", "worker", "-P", "prefork",
        "-c", "2", "-Q", QUEUE, "-l", "WARNING", "-n", worker,
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    log = REPO / "bench" / "results" / f"callgrind-worker-{tree.name}.log"
    log.parent.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    counted: dict[str, list[float]] = {name: [] for name in VARIANTS}
    try:
        benchapp.sentinel.apply_async(queue=QUEUE).get(timeout=900)  # started, under valgrind
        drain(worker, process.pid, VARIANTS["deadline"], 100, "warm")
        for round_no in range(rounds):
            names = list(VARIANTS) if round_no % 2 == 0 else list(VARIANTS)[::-1]
            for name in names:
                tag = f"{tree.name}-{round_no}-{name.replace(' ', '')}"
                counted[name].append(drain(worker, process.pid, VARIANTS[name], tasks, tag))
                print(f"  {tree.name}: {name:9} {counted[name][-1]:12,.0f}", flush=True)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(300)
    return {name: statistics.median(values) for name, values in counted.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=400, help="tasks per drain")
    parser.add_argument("--rounds", type=int, default=2, help="drains of each variant")
    parser.add_argument("--against", type=Path, help="another source tree to count")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    trees = [REPO] + ([args.against.resolve()] if args.against else [])
    results = {tree: count(tree, args.tasks, args.rounds) for tree in trees}
    print("main process, instructions per task (median of the drains):")
    for tree, counts in results.items():
        plain = counts["plain"]
        line = "  ".join(
            f"{name} {value:,.0f} ({value / plain:.3f} x)" for name, value in counts.items()
        )
        print(f"  {tree.name}: {line}")


if __name__ == "__main__":
    main()
