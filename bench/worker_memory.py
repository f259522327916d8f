"""What a prefork worker's main process keeps per DeadlineTask it ran: its memory growth.

One ``celery worker`` (prefork, ``-c 2``, Redis, ``bench/benchapp.py``) drains queues of
``--tasks`` DeadlineTasks (a 300 s budget, so every job has a hard time limit, the
deadline's cap) ``--rounds`` times, and the main process's resident memory is read
after each drain. A worker that keeps nothing per finished job stays flat; one that
keeps a cancelled timer per job until its limit's instant (kombu's event loop does so
for Celery's timer per job, ``celery_deadlines.core.timelimits``) grows by that much per task
until the budget has passed. ``--against TREE`` runs the same on another source tree
(a ``git worktree`` of an older commit), in the same run.

Usage: python bench/worker_memory.py [--tasks 10000] [--rounds 3] [--against TREE]
Needs Redis (``BENCH_BROKER_URL``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
QUEUE = f"bench-mem-{uuid.uuid4().hex[:8]}"
os.environ["BENCH_QUEUE"] = QUEUE

from bench import benchapp  # noqa: E402


def resident(pid: int) -> int:
    """The resident memory of process ``pid`` in bytes (Linux's /proc)."""
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def drain(tasks: int, name: str, worker_name: str) -> None:
    """Fill a queue with ``tasks`` DeadlineTasks, hand it to the worker, wait it out."""
    import redis

    queue = f"{QUEUE}-{name}"
    end = f"{queue}:end"
    for i in range(tasks):
        benchapp.deadline.apply_async((i,), queue=queue)
    benchapp.mark.apply_async((end,), queue=queue)
    benchapp.app.control.add_consumer(queue, reply=True, destination=[worker_name])
    with redis.Redis.from_url(benchapp.MARKS_URL) as store:
        benchapp.wait_for_mark(store, end, queue)
        store.delete(end)
    benchapp.app.control.cancel_consumer(queue, reply=True, destination=[worker_name])


def growth(tree: Path, tasks: int, rounds: int) -> list[float]:
    """MiB the main process grew by after each drain, on the source tree ``tree``."""
    worker_name = f"{QUEUE}-{tree.name}@bench"
    command = [
        sys.executable, "-m", "celery", "-A", "bench.benchapp", "worker", "-P", "prefork",
        "-c", "2", "-Q", QUEUE, "-l", "WARNING", "-n", worker_name,
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{REPO}"}
    worker = subprocess.Popen(
        command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        benchapp.sentinel.apply_async(queue=QUEUE).get(timeout=60)  # ready
        drain(200, f"{tree.name}-warm", worker_name)
        before = resident(worker.pid)
        grown = []
        for round_no in range(rounds):
            drain(tasks, f"{tree.name}-{round_no}", worker_name)
            time.sleep(1.0)
            grown.append((resident(worker.pid) - before) / 2**20)
        return grown
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="DeadlineTasks per drain")
    parser.add_argument("--rounds", type=int, default=3, help="drains, memory read after each")
    parser.add_argument("--against", type=Path, help="another source tree to measure")
    args = parser.parse_args()
    trees = [REPO] + ([args.against.resolve()] if args.against else [])
    print(f"worker main process: resident memory grown after each drain of {args.tasks} tasks")
    for tree in trees:
        grown = growth(tree, args.tasks, args.rounds)
        per_task = grown[-1] * 2**20 / (args.tasks * args.rounds)
        steps = "  ".join(f"{mib:+.1f} MiB" for mib in grown)
        print(f"  {tree.name}: {steps}   ({per_task:.0f} bytes a task)")


if __name__ == "__main__":
    main()
