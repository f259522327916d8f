"""On-time work under overload: open-loop arrivals against a prefork worker.

A ``celery worker`` (prefork, ``-c 4``) runs tasks of 50 ms: 80 tasks/s of capacity.
Each caller has a budget of 1 s. Arrivals are open loop (published on a schedule,
whatever the worker does) for ``--duration`` seconds at 0.5x, 1x, 1.5x, 2x and 3x the
capacity, and in a burst (10x for ``--burst`` seconds, then 0.5x). Each load is run
for each variant in turn, in the same run (the variants' workers are up together,
one loaded at a time):

* ``plain``: a plain Celery task;
* ``expires``: the same task published with Celery's ``expires=1``;
* ``header-off``: a DeadlineTask (budget 1 s, reserve 60 ms) on the header tier,
  published with ``deadlines_backlog_refusal = False`` (the library before issue 49:
  no refusal at enqueue for the queue ahead);
* ``header``: the same DeadlineTask with the defaults;
* ``ledger-off`` and ``ledger``: the same two, recorded by the run ledger on PostgreSQL.

Every message carries its publish instant; the result backend's ``date_done`` is
when the worker ended it (a success stored, or a refusal told); a publish refused at
enqueue (``DeadlineRefused`` raised by ``apply_async``) is told when it returns (its
WARNING line is not printed). A success is on time when it ended within the budget of
its publish, late otherwise. Printed per variant: on-time successes over what was
possible (the arrivals, at most capacity x duration), late successes, the worker-seconds
their bodies took, the p50 and p99 latency of the on-time successes and the median wait
of a refused caller (fractions of the budget), and what was still unanswered when the
drain gave up.

The load ``capacity`` measures each variant's worker alone: capacity x duration messages
published at once, with a budget none of them can miss (``expires`` the same), and the
rate their bodies started at, from the first to the last, over the nominal 80/s: what
the variant's worker serves when it is never idle, the ceiling of its on-time ratio.

Usage: python bench/overload.py [--duration 10] [--burst 2] [--loads 2x,capacity] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from celery_deadlines import DeadlineRefused  # noqa: E402

PREFIX = os.environ.get("BENCH_QUEUE", f"overload-{uuid.uuid4().hex[:6]}")
DATABASE = os.environ.setdefault("BENCH_DATABASE_NAME", f"cd_overload_{uuid.uuid4().hex[:6]}")
ADMIN_URL = os.environ.get("BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
os.environ["BENCH_DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{DATABASE}"

CONCURRENCY = 4
VARIANTS = ("plain", "expires", "header-off", "header", "ledger-off", "ledger")
#: load name -> [(seconds, multiple of the capacity)]: "burst", the burst's; None, the rest
LOADS: dict[str, list[tuple[str | None, float]]] = {
    "0.5x": [(None, 0.5)],
    "1x": [(None, 1.0)],
    "1.5x": [(None, 1.5)],
    "2x": [(None, 2.0)],
    "3x": [(None, 3.0)],
    "burst": [("burst", 10.0), (None, 0.5)],
}


@dataclass
class Outcome:
    """One variant at one load."""

    arrivals: int
    possible: float
    on_time: list[float] = field(default_factory=list)  # latency / budget
    late: int = 0
    late_work: float = 0.0  # worker-seconds
    refused: list[float] = field(default_factory=list)  # wait / budget
    unanswered: int = 0
    lag: float = 0.0  # the publisher's worst lag behind its schedule (s)
    at_enqueue: int = 0  # of the refused, those refused by the publisher
    shed: int = 0  # of those, the ones refused for overload (a tenth of the budget)

    def row(self) -> str:
        on_time = len(self.on_time) / self.possible if self.possible else 0.0
        return (
            f"{self.arrivals:6d} {on_time:8.3f} {self.late:6d} {self.late_work:7.1f} "
            f"{_q(self.on_time, 0.5):6} {_q(self.on_time, 0.99):6} {len(self.refused):6d} "
            f"{_q(self.refused, 0.5):6} {self.unanswered:6d}"
        )


HEADING = (
    f"{'load':8} {'variant':10} {'arrive':>6} {'on-time':>8} {'late':>6} {'late-ws':>7} "
    f"{'p50':>6} {'p99':>6} {'refused':>6} {'told':>6} {'unans':>6}"
)


def _q(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.3f}"


def start_worker(app: str, queue: str, log: Path, prefetch: int | None) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "celery", "-A", app, "worker", "-P", "prefork",
        "-c", str(CONCURRENCY), "-Q", queue, "-l", "WARNING", "-n", f"{queue}@bench",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    if prefetch is not None:
        command += ["--prefetch-multiplier", str(prefetch)]
    with log.open("wb") as out:
        return subprocess.Popen(
            command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def schedule(load: str, duration: float, burst: float, capacity: float) -> list[float]:
    """The arrivals' offsets from the start (seconds), open loop."""
    offsets: list[float] = []
    start = 0.0
    for seconds, multiple in LOADS[load]:
        length = burst if seconds == "burst" else duration - start
        rate = multiple * capacity
        count = round(length * rate)
        offsets.extend(start + k / rate for k in range(count))
        start += length
    return offsets


def publish(task: Any, queue: str, offsets: list[float], options: dict[str, Any]) -> Any:
    """Publish on schedule: the task ids and their publish instants, the refusals at
    enqueue (the instant each caller was told), the worst lag."""
    sent: dict[str, float] = {}
    refused: list[tuple[float, float, bool]] = []
    lag = 0.0
    began = time.monotonic()
    for offset in offsets:
        wait = began + offset - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        else:
            lag = max(lag, -wait)
        published = time.time()
        try:
            result = task.apply_async((published,), queue=queue, **options)
        except DeadlineRefused as refusal:
            # the rule's second part (under overload) says what was offered
            refused.append((published, time.time(), "were offered" in refusal.detail))
            continue
        sent[result.id] = published
    return sent, refused, lag


def answers(backend: Any, ids: list[str]) -> dict[str, dict[str, Any]]:
    """The stored results of ``ids`` (those there are), read from Redis directly."""
    client = backend.client
    found: dict[str, dict[str, Any]] = {}
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        for task_id, raw in zip(
            chunk, client.mget([backend.get_key_for_task(t) for t in chunk]), strict=True
        ):
            if raw is not None:
                found[task_id] = json.loads(raw)
    return found


def instant(meta: dict[str, Any]) -> float:
    done = datetime.fromisoformat(meta["date_done"])
    if done.tzinfo is None:
        done = done.replace(tzinfo=UTC)
    return done.timestamp()


#: The load that measures a variant's worker alone (:func:`run_capacity`).
CAPACITY = "capacity"


def drain(task: Any, queue: str, ids: list[str], duration: float) -> dict[str, dict[str, Any]]:
    """Wait until every caller of ``ids`` is answered, or as long as the backlog can
    take: the stored results there are."""
    patience = time.monotonic() + max(5.0, 3 * duration)
    got: dict[str, dict[str, Any]] = {}
    while time.monotonic() < patience:
        got.update(answers(task.backend, [t for t in ids if t not in got]))
        if len(got) == len(ids):
            break
        time.sleep(0.2)
    if len(got) < len(ids):  # give up: empty the queue and let what is in hand end
        with task.app.connection_for_write() as connection:
            connection.default_channel.queue_purge(queue)
        time.sleep(1.0)
    return got


def run_capacity(variant: str, task: Any, queue: str, duration: float) -> str:
    """Capacity x ``duration`` messages published at once, with a budget none can
    miss: the rate their bodies started at, and its ratio to the nominal capacity."""
    from bench.overloadapp import WORK

    capacity = CONCURRENCY / WORK
    count = round(capacity * duration)
    # a wait of all of them is less than a tenth of it: never refused as overload
    generous = 20 * duration + 60
    options: dict[str, Any] = {}
    if variant == "expires":
        options = {"expires": generous}
    elif variant != "plain":
        options = {"budget": generous}
    sent, at_enqueue, _ = publish(task, queue, [0.0] * count, options)
    got = drain(task, queue, list(sent), duration)
    starts = sorted(meta["result"][1] for meta in got.values() if meta["status"] == "SUCCESS")
    if len(starts) <= CONCURRENCY:
        return f"{count:6d} nothing served ({len(at_enqueue)} refused at enqueue)"
    # the first of each process's bodies start together: the rate is that of the rest
    rate = (len(starts) - CONCURRENCY) / (starts[-1] - starts[0])
    return (
        f"{count:6d} started at {rate:.1f}/s, {rate / capacity:.3f} of the nominal "
        f"{capacity:.0f}/s ({len(at_enqueue)} refused at enqueue, "
        f"{len(sent) - len(starts)} not served)"
    )


def run_one(
    variant: str, task: Any, queue: str, load: str, duration: float, burst: float
) -> Outcome:
    from bench.overloadapp import BUDGET, WORK

    capacity = CONCURRENCY / WORK
    offsets = schedule(load, duration, burst, capacity)

    options = {"expires": BUDGET} if variant == "expires" else {}
    sent, at_enqueue, lag = publish(task, queue, offsets, options)
    ids = list(sent)
    got = drain(task, queue, ids, duration)
    arrivals = len(ids) + len(at_enqueue)
    outcome = Outcome(arrivals, min(arrivals, capacity * duration), lag=lag)
    outcome.refused.extend((told - published) / BUDGET for published, told, _ in at_enqueue)
    outcome.at_enqueue = len(at_enqueue)
    outcome.shed = sum(shed for _, _, shed in at_enqueue)
    for task_id, published in sent.items():
        meta = got.get(task_id)
        if meta is None:
            outcome.unanswered += 1
            continue
        waited = (instant(meta) - published) / BUDGET
        if meta["status"] == "SUCCESS":
            if waited <= 1.0:
                outcome.on_time.append(waited)
            else:
                outcome.late += 1
                outcome.late_work += instant(meta) - meta["result"][1]
        else:
            outcome.refused.append(waited)
    return outcome


def migrate() -> None:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def main() -> None:
    # one WARNING line per refusal at enqueue, in this process: thousands a run
    logging.getLogger("celery_deadlines").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals")
    parser.add_argument("--burst", type=float, default=2.0, help="seconds of the 10x burst")
    parser.add_argument("--loads", default=",".join([*LOADS, CAPACITY]), help="comma-separated")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--smoke", action="store_true", help="seconds: a short burst")
    parser.add_argument(
        "--prefetch-multiplier",
        type=int,
        help="the workers' worker_prefetch_multiplier (Celery's default: 4)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.duration, args.burst, args.loads = 0.4, 0.1, f"burst,{CAPACITY}"
    loads = args.loads.split(",")
    variants = args.variants.split(",")

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{DATABASE}"')
    workers: list[subprocess.Popen[bytes]] = []
    try:
        from bench import overloadapp, overloadledger

        migrate()
        queues = {"app": f"{PREFIX}-app", "ledger": f"{PREFIX}-ledger"}
        workers.append(
            start_worker(
                "bench.overloadapp",
                queues["app"],
                Path(f"/tmp/{PREFIX}-app.log"),
                args.prefetch_multiplier,
            )
        )
        workers.append(
            start_worker(
                "bench.overloadledger",
                queues["ledger"],
                Path(f"/tmp/{PREFIX}-ledger.log"),
                args.prefetch_multiplier,
            )
        )
        overloadapp.sentinel.apply_async(queue=queues["app"]).get(timeout=60)
        overloadledger.sentinel.apply_async(queue=queues["ledger"]).get(timeout=60)
        tasks = {
            "plain": (overloadapp.plain, queues["app"]),
            "expires": (overloadapp.plain, queues["app"]),
            "header-off": (overloadapp.header_before, queues["app"]),
            "header": (overloadapp.header, queues["app"]),
            "ledger-off": (overloadledger.ledgered_before, queues["ledger"]),
            "ledger": (overloadledger.ledgered, queues["ledger"]),
        }
        print(
            f"prefork -c {CONCURRENCY}, tasks of {overloadapp.WORK * 1000:.0f} ms "
            f"({CONCURRENCY / overloadapp.WORK:.0f}/s), budget {overloadapp.BUDGET:g} s, "
            f"reserve {overloadapp.RESERVE * 1000:.0f} ms; arrivals for {args.duration:g} s "
            f"(burst: 10x for {args.burst:g} s, then 0.5x); broker "
            f"{overloadapp.app.conf.broker_url}; prefetch multiplier "
            f"{args.prefetch_multiplier or 'default (4)'}",
            flush=True,
        )
        print(HEADING, flush=True)
        for load in loads:
            for variant in variants:
                task, queue = tasks[variant]
                if load == CAPACITY:
                    served = run_capacity(variant, task, queue, args.duration)
                    print(f"{load:8} {variant:10} {served}", flush=True)
                    continue
                outcome = run_one(variant, task, queue, load, args.duration, args.burst)
                lag = f"  (publisher lag {outcome.lag:.2f} s)" if outcome.lag > 0.1 else ""
                if outcome.at_enqueue:
                    lag += (
                        f"  ({outcome.at_enqueue} refused at enqueue, {outcome.shed} of them "
                        "under overload)"
                    )
                print(f"{load:8} {variant:10} {outcome.row()}{lag}", flush=True)
    finally:
        for worker in workers:
            os.killpg(worker.pid, signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
        from django.db import connections

        connections.close_all()
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


if __name__ == "__main__":
    main()
