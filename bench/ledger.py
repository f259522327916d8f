"""The run ledger vs django-celery-results: end-to-end throughput, and racing claims.

Redis broker, PostgreSQL (a scratch database, created and dropped), one ``celery
worker`` subprocess (prefork, ``-c 2``), same run, the two variants alternating in ABBA
order round by round:

* baseline: a plain task whose result django-celery-results stores (``django-db``);
* ledger: a DeadlineTask with the Django app installed, ``ignore_result=True``: the run
  row (written before publish), its claim and its completion are the tracking.

Throughput is tasks/s from the first publish to the last run recorded as done (polled
in the database). Goal: ledger / baseline >= 1.0. Then claims shaped like Celery
(``bench/claims.py``): 4 processes drain a queue of fresh runs, each delivered to one
of them, 5 % delivered again later to another (a lost claim), the library's claim and
completion against a bare ``UPDATE ... WHERE owner IS NULL`` and a bare completion in
the same harness, ABBA rounds (goal: library >= 0.75 x bare), with the round trips per
claim and the WAL a lost claim writes and syncs. Then 8 processes race to claim the
same runs (each run offered to all 8, exactly one wins), against the same race of bare
``UPDATE`` claims: contention, a separate figure. Then the ledger at two sizes
(``bench/ledger_scale.py``): each statement of a run's life, the sweeper's pass and
``explain`` at 10^4 and at 10^6 runs (goal: within 20 %), and the sweeper's plans.

It ends with one line: ``ledger: default R1x tuned R2x celery_claims_per_s N
bare_claims_per_s M celery_claim_ratio R3 scale_ratio R4``.

Usage: python bench/ledger.py [--tasks 1000] [--rounds 5] [--claims 2000]
    [--claim-rounds 4] [--lost-batch 500] [--races 1] [--scale 1000000]
    [--scale-small 10000] [--samples 200] [--skip-end-to-end] [--scale-only]
    [--page-samples 20] [--counted 200] [--end-to-end-only]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# set once, in the main process; spawned racers and the worker inherit them
DATABASE = os.environ.setdefault("BENCH_DATABASE_NAME", f"cd_bench_{uuid.uuid4().hex[:6]}")
QUEUE = os.environ.setdefault("BENCH_QUEUE", f"bench-{uuid.uuid4().hex[:8]}")
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DATABASE_URL = f"postgresql://postgres@127.0.0.1:5432/{DATABASE}"
os.environ["BENCH_DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{DATABASE}"
SIZES = {alias: f"{DATABASE}_{alias}" for alias in ("small", "large")}
for _alias, _name in SIZES.items():
    os.environ[f"BENCH_{_alias.upper()}_DATABASE_URL"] = (
        f"postgres://postgres@127.0.0.1:5432/{_name}"
    )


def start_worker(
    log: Path, pool: tuple[str, ...] = ("prefork", "-c", "2"), name: str = "", **env: str
) -> subprocess.Popen[bytes]:
    """One ``celery worker`` of the benchmark's app on its queue (``pool``: ``-P`` and
    what follows it; ``env``: added to this process's environment), its output in
    ``log``."""
    command = [
        sys.executable, "-m", "celery", "-A", "bench.ledgerapp", "worker", "-P", *pool,
        "-Q", QUEUE, "-l", "WARNING", "-n", f"{QUEUE}{name}@bench",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(
            command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **env},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


class Counted(NamedTuple):
    """What one run costs the database, counted (not timed): round trips of the
    producer and of the worker, and the cluster's WAL syncs (flushed commits: each
    commit that waits for the disk syncs once; the WAL writer's own syncs and other
    databases' commits in the window are in the figure too)."""

    producer_trips: float
    worker_trips: float
    syncs: float


def settled(tally: Path) -> int:
    """The counting worker's tally once its last task's is written: the worker writes it
    after the task's result, which is what the benchmark waits for (it reads the same
    number twice, 0.2 s apart)."""
    last = None
    while True:
        now = int(tally.read_text()) if tally.exists() else None
        if now is not None and now == last:
            return now
        last = now
        time.sleep(0.2)


def counted(tasks_module: Any, kind: str, tasks: int) -> Counted:
    """Publish ``tasks`` of ``kind`` to a counting solo worker (after 20 not counted)
    and count what each run cost; nothing else runs on the queue meanwhile."""
    from django.db import connections

    from bench.claims import wal

    task = tasks_module.tracked if kind == "tracked" else tasks_module.ledgered
    tally = Path(f"/tmp/{QUEUE}-{kind}.trips")
    tally.unlink(missing_ok=True)
    # a solo worker runs the same task path as a pool process, and its own supervision
    worker = start_worker(
        Path(f"/tmp/{QUEUE}-{kind}-counted.log"),
        ("solo",),
        "-counted",
        BENCH_ROUND_TRIPS=str(tally),
    )
    try:
        end_to_end(task, kind, 20)  # connected, warm, and its tally written
        worker_before = settled(tally)
        connections.close_all()  # this process's statistics reach pg_stat_wal
        before = wal()
        ids = [str(uuid.uuid4()) for _ in range(tasks)]
        published_before = _producer_trips()[0]
        for number, task_id in enumerate(ids):
            task.apply_async((number,), task_id=task_id)
        producer = _producer_trips()[0] - published_before
        while done_count(kind, ids) < tasks:
            time.sleep(0.05)
        worker_trips = settled(tally) - worker_before
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(30)
    connections.close_all()
    after = wal()
    return Counted(producer / tasks, worker_trips / tasks, (after.syncs - before.syncs) / tasks)


_trips: list[list[int]] = []


def _producer_trips() -> list[int]:
    """This process's round trip counter, installed once (each install wraps psycopg's
    wait again)."""
    if not _trips:
        from bench.claims import count_round_trips

        _trips.append(count_round_trips())
    return _trips[0]


def print_counted(tasks_module: Any, tasks: int) -> None:
    """Count both variants (:func:`counted`) and print them side by side."""
    figures = {kind: counted(tasks_module, kind, tasks) for kind in ("tracked", "ledgered")}
    print(f"per run, counted ({tasks} tasks each, a solo worker, not timed):")
    for kind, name in (("tracked", "django-celery-results"), ("ledgered", "run ledger")):
        c = figures[kind]
        print(
            f"  {name:22} {c.producer_trips:4.2f} round trips in the producer, "
            f"{c.worker_trips:4.2f} in the worker, {c.syncs:4.2f} flushed commits (WAL syncs)"
        )
    print(flush=True)


def done_count(kind: str, ids: list[str]) -> int:
    from django.db import connection

    table, done = {
        "tracked": ("django_celery_results_taskresult", "status = 'SUCCESS'"),
        "ledgered": ("celery_deadlines_run", "status = 'SUCCEEDED'"),
    }[kind]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table} WHERE {done} AND task_id = ANY(%s)", [ids])
        row = cursor.fetchone()
    return int(row[0]) if row else 0


#: How long each variant's publishing took in its last round (seconds), kind -> list.
PUBLISHING: dict[str, list[float]] = {"tracked": [], "ledgered": []}


def end_to_end(task: Any, kind: str, tasks: int) -> float:
    ids = [str(uuid.uuid4()) for _ in range(tasks)]
    started = time.perf_counter()
    for number, task_id in enumerate(ids):
        task.apply_async((number,), task_id=task_id)
    PUBLISHING[kind].append(time.perf_counter() - started)
    while done_count(kind, ids) < tasks:
        time.sleep(0.02)
    return tasks / (time.perf_counter() - started)


def racer(index: int, task_ids: list[str], barrier: Any, results: Any) -> None:
    import django

    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.ledger_settings"
    django.setup()
    from celery_deadlines.ledger.sql.connection import Store
    from celery_deadlines.ledger.sql.rows import Lease

    store = Store(dedicated=True)  # as a worker claims: a connection of its own
    order = list(task_ids)
    random.Random(index).shuffle(order)
    barrier.wait()
    started = time.perf_counter()
    won = 0
    for task_id in order:
        outcome = store.runs.claim(
            task_id,
            0,
            task_name="race",
            owner=f"racer-{index}",
            ttl=timedelta(60),
            reserve=timedelta(0),
            max_lost_leases=3,
        )
        won += isinstance(outcome, Lease)
    results.put((won, len(order), time.perf_counter() - started))


def run_racers(target: Any, work: Any, racers: int = 8) -> list[Any]:
    """What each of ``racers`` spawned processes ``target(index, work, barrier,
    results)`` put in ``results``; the barrier starts them together."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(racers)
    results = context.Queue()
    processes = [
        context.Process(target=target, args=(i, work, barrier, results)) for i in range(racers)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=600) for _ in processes]
    for process in processes:
        process.join()
    return outcomes


def bare_racer(index: int, rows: int, barrier: Any, results: Any) -> None:
    """One of :func:`bare_race`'s racers: each row once, in an order of its own."""
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        order = list(range(rows))
        random.Random(index).shuffle(order)
        barrier.wait()
        started = time.perf_counter()
        won = 0
        for row in order:
            taken = conn.execute(
                "UPDATE bench_bare_race SET owner = %s WHERE id = %s AND owner IS NULL "
                "RETURNING id",
                [index, row],
            ).fetchone()
            won += taken is not None
        results.put((won, time.perf_counter() - started))


def bare_race(rows: int) -> float:
    """Rows won/s when 8 processes race as the claim race does, each attempt a bare
    one-row ``UPDATE ... WHERE owner IS NULL``: what a claim that were only a
    compare-and-swap, with no lease, token, checks or event, would reach here."""
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_bare_race")
        conn.execute("CREATE TABLE bench_bare_race (id int PRIMARY KEY, owner int)")
        conn.execute(
            "INSERT INTO bench_bare_race SELECT g, NULL FROM generate_series(0, %s) g",
            [rows - 1],
        )
    outcomes = run_racers(bare_racer, rows)
    won: int = sum(count for count, _ in outcomes)
    wall: float = max(seconds for _, seconds in outcomes)
    return won / wall


def transactions() -> int:
    """Transactions committed or rolled back in the benchmark's database so far."""
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            [DATABASE],
        ).fetchone()
    return int(row[0]) if row else 0


def racing_claims(claims: int) -> tuple[float, float, int, float]:
    """Claims won/s, claim attempts/s, claims won, and transactions per attempt (each
    attempt is one statement in autocommit; the racers' connecting adds a few)."""
    from celery_deadlines.ledger.sql.connection import Store
    from celery_deadlines.ledger.sql.rows import NewRun

    store = Store()
    ids = [f"race-{uuid.uuid4().hex}" for _ in range(claims)]
    for task_id in ids:
        store.outbox.enqueue(
            NewRun(
                task_id=task_id,
                task_name="race",
                deadline=None,
                delivery_deadline=None,
                root_id=task_id,
                parent_id="",
                retries=0,
                available_at=None,
                message_body=None,
                content_type="",
                content_encoding="",
            )
        )
    before = transactions()
    outcomes = run_racers(racer, ids)
    time.sleep(1.0)  # the racers' statistics reach pg_stat_database as they exit
    statements = transactions() - before - 1
    wall = max(seconds for _, _, seconds in outcomes)
    won = sum(w for w, _, _ in outcomes)
    attempts = sum(a for _, a, _ in outcomes)
    return won / wall, attempts / wall, won, statements / attempts


def compare(tasks_module: Any, tasks: int, rounds: int, reuse: bool) -> float:
    """ABBA rounds of both variants on the running worker; print medians and the ratio."""
    end_to_end(tasks_module.tracked, "tracked", 50)  # ready and warm
    end_to_end(tasks_module.ledgered, "ledgered", 50)
    rates: dict[str, list[float]] = {"tracked": [], "ledgered": []}
    for round_no in range(rounds):
        order = ["tracked", "ledgered"] if round_no % 2 == 0 else ["ledgered", "tracked"]
        for kind in order:
            task = tasks_module.tracked if kind == "tracked" else tasks_module.ledgered
            rates[kind].append(end_to_end(task, kind, tasks))
        print(
            f"  round {round_no + 1}: django-celery-results {rates['tracked'][-1]:.0f}/s "
            f"(published in {PUBLISHING['tracked'][-1]:.2f} s), ledger "
            f"{rates['ledgered'][-1]:.0f}/s (published in {PUBLISHING['ledgered'][-1]:.2f} s)",
            flush=True,
        )
    baseline = statistics.median(rates["tracked"])
    ledger = statistics.median(rates["ledgered"])
    how = (
        "CELERY_DB_REUSE_MAX set: Django's connections kept across tasks"
        if reuse
        else "Celery's default: Django's connections closed around every task"
    )
    print(
        f"end to end, {how} ({tasks} tasks x {rounds} rounds, Redis + PostgreSQL, "
        f"prefork -c 2):\n"
        f"  plain Celery + django-celery-results: {baseline:.0f} tasks/s (median)\n"
        f"  DeadlineTask + run ledger:            {ledger:.0f} tasks/s (median)\n"
        f"  ratio ledger / baseline:              {ledger / baseline:.3f} (goal >= 1.0)\n",
        flush=True,
    )
    return ledger / baseline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000, help="tasks per round")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per variant")
    parser.add_argument("--claims", type=int, default=2000, help="runs a claim round, a race")
    parser.add_argument("--claim-rounds", type=int, default=4, help="ABBA rounds of claims")
    parser.add_argument("--lost-batch", type=int, default=500, help="0: no WAL check")
    parser.add_argument("--races", type=int, default=1, help="races of 8 over each run")
    parser.add_argument("--scale", type=int, default=1_000_000, help="runs of the large ledger")
    parser.add_argument("--scale-small", type=int, default=10_000, help="of the small ledger")
    parser.add_argument("--samples", type=int, default=200, help="timings of each statement")
    parser.add_argument("--skip-end-to-end", action="store_true", help="claims and scale only")
    parser.add_argument(
        "--scale-only", action="store_true", help="the two sizes alone (statements, console)"
    )
    parser.add_argument("--page-samples", type=int, default=20, help="timings of each page")
    parser.add_argument("--counted", type=int, default=200, help="runs counted of each variant")
    parser.add_argument(
        "--end-to-end-only", action="store_true", help="the counted runs and the two comparisons"
    )
    args = parser.parse_args()

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{DATABASE}"')
    worker = None
    ratios: dict[bool, float] = {}
    try:
        from django.core.management import call_command
        from django.db import connections

        from bench import claims, ledgerapp

        call_command("migrate", verbosity=0)
        # the two sizes' ledgers: copies of the migrated, still empty one (a migration
        # is several seconds; a copy, a fraction of one)
        connections.close_all()
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            for name in SIZES.values():
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{DATABASE}"')
        skip = args.skip_end_to_end or args.scale_only
        if not skip:
            os.environ["BENCH_DB_REUSE_MAX"] = "1000000"  # as the tuned comparison runs
            print_counted(ledgerapp, args.counted)
        for reuse in (False, True) if not skip else ():
            os.environ["BENCH_DB_REUSE_MAX"] = "1000000" if reuse else ""
            worker = start_worker(Path(f"/tmp/{QUEUE}-{int(reuse)}.log"))
            if not args.skip_end_to_end:
                ratios[reuse] = compare(ledgerapp, args.tasks, args.rounds, reuse)
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(30)
            worker = None
        if args.end_to_end_only:
            print(f"ledger: {_end_to_end(ratios)}")
            return
        if args.scale_only:
            at_scale(args.scale_small, args.scale, args.samples, args.page_samples)
            return
        shaped = claims.compare(args.claims, args.claim_rounds)
        if args.lost_batch:
            claims.lost_claim_flushes(args.lost_batch)
        races = [racing_claims(args.claims) for _ in range(args.races)]
        for race, (won_rate, attempt_rate, won, statements) in enumerate(races):
            print(
                f"racing claims {race + 1} (contention, not Celery's shape): 8 processes x "
                f"{args.claims} runs, each offered to all: {won} won (one per run), "
                f"{won_rate:.0f} claims/s won, {attempt_rate:.0f} claim attempts/s, "
                f"{statements:.2f} transactions per attempt",
                flush=True,
            )
        if races:
            won_rate = statistics.median(won for won, _, _, _ in races)
            bare = bare_race(args.claims)
            print(
                f"  the same race with a bare one-row UPDATE for a claim (no lease, token, "
                f"checks or event): {bare:.0f} won/s; ratio {won_rate / bare:.2f}",
                flush=True,
            )
        print(flush=True)
        scale_ratio = at_scale(args.scale_small, args.scale, args.samples, args.page_samples)
        print(
            f"ledger: {_end_to_end(ratios)} "
            f"celery_claims_per_s {shaped.median(claims.LIBRARY):.0f} bare_claims_per_s "
            f"{shaped.median(claims.BARE):.0f} celery_claim_ratio {shaped.ratio:.3f} "
            f"scale_ratio {scale_ratio:.2f}"
        )
    finally:
        if worker is not None:
            os.killpg(worker.pid, signal.SIGKILL)
        from django.db import connections

        connections.close_all()
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            for name in (DATABASE, *SIZES.values()):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _end_to_end(ratios: dict[bool, float]) -> str:
    """The summary line's end-to-end part: ``default R1x tuned R2x``."""
    return f"default {_ratio(ratios.get(False))} tuned {_ratio(ratios.get(True))}"


def at_scale(small_runs: int, large_runs: int, samples: int, page_samples: int) -> float:
    """The ledger at two sizes (bench/ledger_scale.py); the worst ratio large / small of
    its statements (the console's pages' is printed)."""
    from django.core.management import call_command

    from bench import ledger_scale

    started = time.perf_counter()
    for alias, runs in (("small", small_runs), ("large", large_runs)):
        call_command("migrate", database=alias, verbosity=0)
        ledger_scale.fill(alias, runs)
        for table in ("run", "effect", "runevent"):  # as autovacuum leaves the tables
            ledger_scale.sql(alias, f"VACUUM ANALYZE celery_deadlines_{table}")
    print(f"filled the two ledgers in {time.perf_counter() - started:.0f} s", flush=True)
    small, large = ledger_scale.Ledger("small"), ledger_scale.Ledger("large")
    main_ledger = ledger_scale.Ledger("default")  # commits flushed, as in production
    ledger_scale.lifecycle(main_ledger, samples)
    main_ledger.worker.close()
    worst = ledger_scale.compare(small, large, samples)
    clean = ledger_scale.sweeper_plans(large)
    print(f"sweeper's plans: {'no' if clean else 'a'} sequential scan of a ledger table")
    pages = ledger_scale.admin_pages(small, large, page_samples)
    print(f"console: worst page ratio {pages:.2f} (goal: flat; each page < 0.5 s)", flush=True)
    for ledger in (small, large):
        ledger.worker.close()
    return worst


if __name__ == "__main__":
    main()
