"""A claim benchmark shaped like Celery (issue 33, item 3): the library's claim against a
bare ``UPDATE ... WHERE owner IS NULL``, in the same harness.

Contract, per round and per variant (PostgreSQL, the database of ``BENCH_DATABASE_URL``,
the ledger's tables migrated):

* fresh runs, created before the round and not timed: the ledger's through the
  producer's own ``enqueue`` (QUEUED, a deadline an hour away, as a DeadlineTask with a
  budget records them); the baseline's as bare rows (``id``, ``owner`` NULL, ``done``);
* the queue is dealt out to ``--workers`` (4) spawned processes before they start, as a
  broker's prefetch deals it: run ``i`` to worker ``i mod 4``, in order; ``--redelivered``
  (5 %) of the runs, a seeded draw, are delivered a second time, to another worker, 1 to
  40 of its deliveries after the first one's place (a broker's redelivery: the run is by
  then owned or ended, so that claim is lost);
* each process claims every delivery in turn and completes what it won, on a connection
  of its own kept open (autocommit):

  - library: ``celery_deadlines.ledger.api.claim_run`` (what a DeadlineTask's claim
    calls: the worker's dedicated store, one statement won or lost; ``exclusive``, as a
    prefork pool process claims), and a won claim's ``Attempt.succeed()`` (the
    completion, one fenced statement);
  - bare: psycopg, ``UPDATE bench_bare_run SET owner = %s WHERE id = %s AND owner IS
    NULL RETURNING id``, and for a won claim ``UPDATE bench_bare_run SET done = true
    WHERE id = %s AND owner = %s``: the ceiling of any one-statement claim here. Each
    commit waits for the disk; with ``--bare-claim-lax`` the claim's does not, as the
    library's won claim does not in a process that runs one attempt at a time (these
    do: each claims on its main thread), so the two pay the same flushes;

* claims/s: runs claimed and completed per second, from the barrier that starts the
  processes together to the last one's end; every run is checked claimed by exactly
  one process and completed (the lost claims are the redeliveries, no more).

Rounds alternate ABBA (library first in odd rounds); the figures are each round's and
the medians. Round trips are counted in each process as psycopg's waits on its socket
(one per statement sent and answered), for won claims, lost claims and completions
apart, and the CPU per run of the worker processes and of their database backends
(``/proc``: the server on this machine), the rate's two sides. After the rounds,
``lost_claim_flushes`` reads the cluster's WAL counters (``pg_stat_wal``) and the
blocks the database read (``pg_stat_database``) around a batch of lost claims of each
variant, and around a batch of bare won claims (each a flushed commit: the meter's
control), and ``instructions`` counts the client's CPU instructions per claim under
valgrind's callgrind.

Usage (a scratch database of its own, created and dropped): python bench/claims.py
    [--runs 2000] [--rounds 4] [--workers 4] [--redelivered 0.05] [--lost-batch 500]
    [--instructions 300] [--bare-claim-lax] [--without-index NAME ...]
    (``--instructions 0``: no callgrind, which takes minutes; ``--rounds 0
    --lost-batch 0``: callgrind alone; ``--without-index``: what an index of the
    ledger's costs the claims, measured without it)
``bench/ledger.py`` runs the rounds and the flush check too, and puts the ratio in its
summary line (``celery_claim_ratio``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, NamedTuple, TypeVar

import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.callgrind import collected  # noqa: E402

ADMIN_URL: Final = "postgresql://postgres@127.0.0.1:5432/postgres"
LIBRARY: Final = "library"
BARE: Final = "bare"
#: The baseline's claim and completion: a compare-and-swap on the owner, nothing else.
BARE_CLAIM: Final = (
    "UPDATE bench_bare_run SET owner = %s WHERE id = %s AND owner IS NULL RETURNING id"
)
#: The same claim committing without waiting for the disk, as the library's won claim
#: does for a process that runs one attempt at a time (``--bare-claim-lax``): the
#: baseline with the library's durability, rather than a flushed commit per claim.
BARE_CLAIM_LAX: Final = (
    "UPDATE bench_bare_run SET owner = %s WHERE id = %s AND owner IS NULL "
    "AND set_config('synchronous_commit', 'off', true) IS NOT NULL RETURNING id"
)
BARE_COMPLETE: Final = "UPDATE bench_bare_run SET done = true WHERE id = %s AND owner = %s"
#: A claim's lease and reserve, as a DeadlineTask's default settings give them.
TTL: Final = timedelta(seconds=30)
RESERVE: Final = timedelta(0)
#: The task of every run claimed here (bench/ledgerapp.py's ``bench.ledgered``).
TASK_NAME: Final = "bench.ledgered"
#: Deliveries each process makes before the barrier (not timed): its connection opened
#: and its statements prepared, as a worker's are after its first tasks.
WARM: Final = 20
#: How far after its first delivery a redelivery comes, in the other worker's deliveries.
LATER: Final = (1, 40)

_T = TypeVar("_T")


def database_url() -> str:
    """The benchmark's database for psycopg (Django's settings read the same variable)."""
    return os.environ["BENCH_DATABASE_URL"].replace("postgres://", "postgresql://", 1)


# -- the queue ---------------------------------------------------------------------------


def deal(runs: Sequence[_T], workers: int, share: float, seed: int) -> list[list[_T]]:
    """Each worker's deliveries in order: run ``i`` to worker ``i mod workers`` at place
    ``i // workers``; ``share`` of the runs again to another worker, ``LATER`` places
    after the first delivery's place (the end of its list if that is past it)."""
    rng = random.Random(seed)
    placed: list[list[tuple[float, _T]]] = [[] for _ in range(workers)]
    for i, run in enumerate(runs):
        placed[i % workers].append((i // workers, run))
    for i in rng.sample(range(len(runs)), round(share * len(runs))):
        other = (i % workers + rng.randrange(1, workers)) % workers
        placed[other].append((i // workers + rng.randint(*LATER) + 0.5, runs[i]))
    return [[run for _, run in sorted(places, key=lambda p: p[0])] for places in placed]


def ledger_runs(count: int, tag: str) -> list[str]:
    """``count`` fresh QUEUED runs in the ledger, recorded as the producer records them
    (one transaction, not timed); their task ids."""
    from celery_deadlines.ledger.sql.connection import Store
    from celery_deadlines.ledger.sql.rows import NewRun

    store = Store()
    deadline = datetime.now(UTC) + timedelta(hours=1)
    ids = [f"{tag}-{uuid.uuid4().hex}" for _ in range(count)]
    with store.transaction():
        for task_id in ids:
            store.outbox.enqueue(NewRun(task_id=task_id, task_name=TASK_NAME, deadline=deadline))
    return ids


def bare_runs(count: int) -> list[int]:
    """``count`` fresh bare rows (owner NULL); their ids."""
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_bare_run "
            "(id bigint PRIMARY KEY, owner text, done boolean NOT NULL DEFAULT false)"
        )
        row = conn.execute("SELECT coalesce(max(id), 0) FROM bench_bare_run").fetchone()
        first = int(row[0]) + 1 if row else 1
        conn.execute(
            "INSERT INTO bench_bare_run (id) SELECT generate_series(%s::bigint, %s::bigint)",
            [first, first + count - 1],
        )
    return list(range(first, first + count))


# -- one worker process --------------------------------------------------------------------


def count_round_trips() -> list[int]:
    """From now on, every psycopg wait on a connection's socket (a statement sent and
    its answer read: one round trip) adds one to the returned counter."""
    counter = [0]
    wait = psycopg.Connection.wait

    def counted(self: psycopg.Connection[Any], gen: Any, *args: Any, **kwargs: Any) -> Any:
        counter[0] += 1
        return wait(self, gen, *args, **kwargs)

    setattr(psycopg.Connection, "wait", counted)  # noqa: B010 (mypy: a method assigned)
    return counter


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user and system) the database backend ``pid`` has used, from
    ``/proc``; ``None`` where it cannot be read (the server on another machine or in
    another process namespace)."""
    try:
        if not Path(f"/proc/{pid}/comm").read_text().startswith("postgres"):
            return None  # another process: the server's pids are another namespace's
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Steps(NamedTuple):
    """A variant's work in one worker process."""

    #: claim one delivery: true if won (the attempt kept for the completion), else why
    claim: Callable[[Any], bool | str]
    #: complete the last claim won
    complete: Callable[[], None]
    #: the process id of the database backend that serves both
    backend: Callable[[], int]


class Tally(NamedTuple):
    """What one worker process did in the timed part."""

    won: int
    lost: int
    seconds: float
    #: round trips of the won claims, of the lost ones, of the completions
    trips_won: int
    trips_lost: int
    trips_completed: int
    #: why the lost claims were lost (the library's refusal codes; ``owned`` for bare)
    why: dict[str, int]
    #: CPU seconds of this process, and of its database backend (``None``: unreadable)
    client_cpu: float
    server_cpu: float | None


def _library_steps(index: int) -> Steps:
    """The library's claim of one delivery (the won attempt kept for the completion: a
    true result; a lost claim's reason otherwise) and the completion of the last won."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.ledger_settings"
    from bench.ledgerapp import app
    from celery_deadlines.ledger import api

    hostname = f"celery@claims-{index}"
    won: list[api.Attempt] = []

    def unrecorded() -> api.NewRun:
        raise AssertionError("every delivered run is recorded before the round")

    def claim(task_id: str) -> bool | str:
        outcome = api.claim_run(
            app,
            task_id=task_id,
            task_name=TASK_NAME,
            retries=0,
            hostname=hostname,
            ttl=TTL,
            reserve=RESERVE,
            unrecorded=unrecorded,
            exclusive=True,  # as a prefork pool process claims (celery_deadlines.core.pools)
        )
        if isinstance(outcome, api.Attempt):
            won.append(outcome)
            return True
        assert isinstance(outcome, api.ClaimRefused), outcome
        return outcome.why

    def complete() -> None:
        won.pop().succeed()

    def backend() -> int:
        _, rows = api.store_for(app, dedicated=True).execute("SELECT pg_backend_pid()", [])
        return int(rows[0][0])

    return Steps(claim, complete, backend)


def _bare_steps(index: int) -> Steps:
    """The baseline's claim of one delivery and completion of the last won."""
    conn = psycopg.connect(database_url(), autocommit=True)
    owner = f"celery@claims-{index}:{os.getpid()}"
    last = [0]
    statement = BARE_CLAIM_LAX if os.environ.get("BENCH_BARE_CLAIM_LAX") else BARE_CLAIM

    def claim(run_id: int) -> bool | str:
        if conn.execute(statement, [owner, run_id]).fetchone() is None:
            return "owned"
        last[0] = run_id
        return True

    def complete() -> None:
        conn.execute(BARE_COMPLETE, [last[0], owner])

    return Steps(claim, complete, lambda: conn.info.backend_pid)


def worker(
    index: int, variant: str, warm: list[Any], deliveries: list[Any], barrier: Any, results: Any
) -> None:
    """One worker process: ``warm`` claimed and completed (and claimed again: lost)
    before the barrier, then ``deliveries`` in order, timed; its :class:`Tally` put in
    ``results``."""
    claim, complete, backend = (_library_steps if variant == LIBRARY else _bare_steps)(index)
    trips = count_round_trips()
    for item in warm:
        if claim(item) is True:
            complete()
    for item in warm[:5]:
        claim(item)
    won = lost = trips_won = trips_lost = trips_completed = 0
    why: Counter[str] = Counter()
    server = backend()
    barrier.wait()
    started = time.perf_counter()
    client_started, server_started = time.process_time(), cpu_seconds(server)
    for item in deliveries:
        before = trips[0]
        outcome = claim(item)
        claimed = trips[0]
        if outcome is True:
            complete()
            won += 1
            trips_won += claimed - before
            trips_completed += trips[0] - claimed
        else:
            lost += 1
            trips_lost += claimed - before
            why[str(outcome)] += 1
    seconds = time.perf_counter() - started
    client_cpu = time.process_time() - client_started
    server_ended = cpu_seconds(server)
    server_cpu = (
        None if server_started is None or server_ended is None else server_ended - server_started
    )
    results.put(
        Tally(
            won=won,
            lost=lost,
            seconds=seconds,
            trips_won=trips_won,
            trips_lost=trips_lost,
            trips_completed=trips_completed,
            why=dict(why),
            client_cpu=client_cpu,
            server_cpu=server_cpu,
        )
    )


# -- a round -------------------------------------------------------------------------------


@dataclass
class Round:
    """One variant's round: claims/s and what its processes counted."""

    variant: str
    runs: int
    tallies: list[Tally]

    @property
    def wall(self) -> float:
        return max(tally.seconds for tally in self.tallies)

    @property
    def won(self) -> int:
        return sum(tally.won for tally in self.tallies)

    @property
    def lost(self) -> int:
        return sum(tally.lost for tally in self.tallies)

    @property
    def claims_per_s(self) -> float:
        return self.won / self.wall

    def cpu(self, side: str) -> float | None:
        """CPU microseconds per run claimed and completed (lost claims included), of the
        worker processes (``client``) or of their database backends (``server``: ``None``
        if a backend's could not be read)."""
        spent: list[float | None] = [getattr(tally, f"{side}_cpu") for tally in self.tallies]
        known = [seconds for seconds in spent if seconds is not None]
        if len(known) < len(spent):
            return None
        return 1e6 * sum(known) / max(self.won, 1)

    def trips(self, kind: str) -> float:
        """Round trips per won claim (``won``), lost claim (``lost``), completion."""
        total: int = sum(getattr(tally, f"trips_{kind}") for tally in self.tallies)
        return total / max(self.lost if kind == "lost" else self.won, 1)

    @property
    def why(self) -> Counter[str]:
        reasons: Counter[str] = Counter()
        for tally in self.tallies:
            reasons.update(tally.why)
        return reasons


def one_round(variant: str, runs: int, workers: int, share: float, seed: int) -> Round:
    """``runs`` fresh runs of ``variant`` drained by ``workers`` processes (module
    docstring); checked: each claimed by one process and completed."""
    make: Callable[[int], list[Any]]
    make = (lambda n: ledger_runs(n, f"claims-{seed}")) if variant == LIBRARY else bare_runs
    items = make(runs + WARM * workers)
    warm, queued = items[: WARM * workers], items[WARM * workers :]
    dealt = deal(queued, workers, share, seed)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(workers)
    results = context.Queue()
    processes = [
        context.Process(
            target=worker,
            args=(i, variant, warm[i * WARM : (i + 1) * WARM], dealt[i], barrier, results),
        )
        for i in range(workers)
    ]
    for process in processes:
        process.start()
    tallies = [results.get(timeout=600) for _ in processes]
    for process in processes:
        process.join()
    done = _completed(variant, queued)
    result = Round(variant, runs, tallies)
    if result.won != runs or done != runs or result.lost != sum(map(len, dealt)) - runs:
        raise SystemExit(
            f"{variant}: {result.won} claims won, {done} runs completed, {result.lost} lost "
            f"of {runs} runs: each must be claimed once and completed"
        )
    return result


def _completed(variant: str, items: list[Any]) -> int:
    """How many of ``items`` were completed, by one claim each (the ledger's: attempt 1)."""
    with psycopg.connect(database_url(), autocommit=True) as conn:
        if variant == LIBRARY:
            row = conn.execute(
                "SELECT count(*) FROM celery_deadlines_run WHERE task_id = ANY(%s) "
                "AND status = 'SUCCEEDED' AND attempt = 1 AND lease_token = 1",
                [items],
            ).fetchone()
        else:
            row = conn.execute(
                "SELECT count(*) FROM bench_bare_run WHERE id = ANY(%s) AND done",
                [items],
            ).fetchone()
    return int(row[0]) if row else 0


@dataclass
class Figures:
    """The rounds of both variants, in the order they ran."""

    rounds: list[tuple[Round, Round]] = field(default_factory=list)  # (library, bare)

    def median(self, variant: str) -> float:
        index = 0 if variant == LIBRARY else 1
        return statistics.median(pair[index].claims_per_s for pair in self.rounds)

    @property
    def ratio(self) -> float:
        return self.median(LIBRARY) / self.median(BARE)


def compare(
    runs: int, rounds: int, workers: int = 4, share: float = 0.05, seed: int = 33
) -> Figures:
    """ABBA rounds of both variants; each round's line, then the medians, printed."""
    figures = Figures()
    for number in range(rounds):
        order = (LIBRARY, BARE) if number % 2 == 0 else (BARE, LIBRARY)
        done = {
            variant: one_round(variant, runs, workers, share, seed + number) for variant in order
        }
        library, bare = done[LIBRARY], done[BARE]
        figures.rounds.append((library, bare))
        reasons = ", ".join(f"{why} {count}" for why, count in sorted(library.why.items()))
        print(
            f"  round {number + 1} ({order[0]} first): library {library.claims_per_s:.0f} "
            f"claims/s, bare {bare.claims_per_s:.0f}/s, ratio "
            f"{library.claims_per_s / bare.claims_per_s:.3f}; round trips per won claim, "
            f"lost claim, completion: library {library.trips('won'):.2f}, "
            f"{library.trips('lost'):.2f}, {library.trips('completed'):.2f}, bare "
            f"{bare.trips('won'):.2f}, {bare.trips('lost'):.2f}, "
            f"{bare.trips('completed'):.2f}; lost claims {library.lost} ({reasons}), "
            f"bare {bare.lost}",
            flush=True,
        )
        print(f"    CPU per run, worker processes / database backends: {_cpu(library, bare)}")
    ratios = [lib.claims_per_s / bare.claims_per_s for lib, bare in figures.rounds]
    print(
        f"Celery-shaped claims ({workers} processes, {runs} runs a round, "
        f"{share:.0%} redelivered to another process, {rounds} ABBA rounds):\n"
        f"  library (claim_run + Attempt.succeed): {figures.median(LIBRARY):.0f} claims/s "
        f"(median)\n"
        f"  bare UPDATE claim + completion:        {figures.median(BARE):.0f} claims/s "
        f"(median)\n"
        f"  ratio library / bare:                  {figures.ratio:.3f} (goal >= 0.75; "
        f"rounds' own ratios {min(ratios):.3f}-{max(ratios):.3f})",
        flush=True,
    )
    return figures


def _cpu(library: Round, bare: Round) -> str:
    """A round's CPU per run of both variants: client / server microseconds."""

    def both(one: Round) -> str:
        client, server = one.cpu("client"), one.cpu("server")
        return f"{client:.0f} / " + ("n/a" if server is None else f"{server:.0f} us")

    return f"library {both(library)}, bare {both(bare)}"


# -- does a lost claim flush a commit? --------------------------------------------------------


class Wal(NamedTuple):
    """The cluster's WAL counters (``pg_stat_wal``) and insert position, and the blocks
    the benchmark's database read (``pg_stat_database``: shared buffers hit or read,
    the server's work for a statement in a unit that does not depend on the load)."""

    records: int
    fpi: int
    bytes: int
    writes: int
    syncs: int
    lsn: int
    blocks: int


def wal() -> Wal:
    """The counters now, once every backend's and the WAL writer's have reached the
    statistics (they report at most once a second, and at exit)."""
    time.sleep(1.2)
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT wal_records, wal_fpi, wal_bytes, wal_write, wal_sync, "
            "pg_current_wal_lsn() - '0/0'::pg_lsn, (SELECT blks_hit + blks_read "
            "FROM pg_stat_database WHERE datname = %s) FROM pg_stat_wal",
            [psycopg.conninfo.conninfo_to_dict(database_url())["dbname"]],
        ).fetchone()
    assert row is not None
    return Wal(*(int(value) for value in row))


def _batch(name: str, count: int, run: Callable[[], None]) -> str:
    """``run()`` between two readings of :func:`wal`, per claim."""
    before = wal()
    started = time.perf_counter()
    run()
    seconds = time.perf_counter() - started
    after = wal()
    per = {key: (getattr(after, key) - getattr(before, key)) / count for key in Wal._fields}
    return (
        f"  {name:34} {per['syncs']:5.3f} WAL syncs, {per['writes']:5.3f} writes, "
        f"{per['records']:4.2f} records, {per['fpi']:4.2f} full pages, {per['lsn']:5.0f} "
        f"bytes, {per['blocks']:5.2f} blocks per claim ({count} in {seconds:.2f} s)"
    )


def lost_claim_flushes(batch: int = 500) -> None:
    """Print the WAL syncs, writes, records and bytes per claim around ``batch`` lost
    claims of each variant (runs completed first, claimed again by another worker: the
    refusal a redelivery meets), around ``batch`` won claims of the library's, by an
    owner that runs one attempt at a time (no flush) and by one that runs several (each
    flushed), and around ``batch`` bare won claims (each commit flushed: the control
    that shows the meter sees a flush). The counters are the
    cluster's: what other databases write in the window is in them; an idle window of
    the same pause comes first, for that."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.ledger_settings"
    from bench.ledgerapp import app
    from celery_deadlines.ledger import api

    ended = ledger_runs(batch, "flush")
    for task_id in ended:  # claimed and completed by a first worker
        attempt = api.claim_run(
            app, task_id=task_id, task_name=TASK_NAME, retries=0, hostname="celery@first",
            ttl=TTL, reserve=RESERVE, unrecorded=_no_run,
        )  # fmt: skip
        assert isinstance(attempt, api.Attempt)
        attempt.succeed()
    api.store_for(app, dedicated=True).close()

    def library_lost() -> None:
        for task_id in ended:
            refused = api.claim_run(
                app, task_id=task_id, task_name=TASK_NAME, retries=0,
                hostname="celery@second", ttl=TTL, reserve=RESERVE, unrecorded=_no_run,
            )  # fmt: skip
            assert isinstance(refused, api.ClaimRefused)
        api.store_for(app, dedicated=True).close()  # its statistics reported at exit

    def library_won(exclusive: bool) -> Callable[[], None]:
        fresh = ledger_runs(batch, f"won-{exclusive}")

        def run() -> None:
            for task_id in fresh:
                attempt = api.claim_run(
                    app, task_id=task_id, task_name=TASK_NAME, retries=0,
                    hostname="celery@first", ttl=TTL, reserve=RESERVE, unrecorded=_no_run,
                    exclusive=exclusive,
                )  # fmt: skip
                assert isinstance(attempt, api.Attempt)
            api.store_for(app, dedicated=True).close()

        return run

    owned = bare_runs(batch)

    def bare(claimed: bool) -> Callable[[], None]:
        def run() -> None:
            with psycopg.connect(database_url(), autocommit=True) as conn:
                for run_id in owned:
                    row = conn.execute(BARE_CLAIM, [f"celery@{claimed}", run_id]).fetchone()
                    assert (row is not None) is not claimed

        return run

    print(f"does a lost claim flush a commit? (pg_stat_wal, {batch} claims a batch)")
    print(_batch("nothing (the same pauses)", batch, lambda: None))
    print(_batch("library: won claims, one at a time", batch, library_won(True)))
    print(_batch("library: won claims, shared owner", batch, library_won(False)))
    print(_batch("library: lost claims", batch, library_lost))
    print(_batch("bare: won claims (each flushed)", batch, bare(False)))
    print(_batch("bare: lost claims", batch, bare(True)), flush=True)


def _no_run() -> Any:
    raise AssertionError("the run is recorded")


# -- client instructions per claim ------------------------------------------------------------

#: The counted loop, in a fresh interpreter under callgrind: ``count`` claims (or
#: completions) of one variant, after a warm-up; only ``functools.reduce`` is counted.
LOOP = """
import functools
import gc
import os
import sys

sys.path.insert(0, sys.argv[1])
count, variant = int(sys.argv[2]), sys.argv[3]
from bench import claims

warm = 50
if variant.startswith("library"):
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.ledger_settings"
    from bench.ledgerapp import app
    from celery_deadlines.ledger import api

    ids = claims.ledger_runs(warm + count, "callgrind")

    def claim(task_id, host="celery@counted"):
        return api.claim_run(app, task_id=task_id, task_name=claims.TASK_NAME, retries=0,
                             hostname=host, ttl=claims.TTL, reserve=claims.RESERVE,
                             unrecorded=None, exclusive=True)

    if variant == "library-lost":  # completed by another worker first
        for task_id in ids:
            claim(task_id, "celery@first").succeed()
        step = claim
    elif variant == "library-complete":
        attempts = [claim(task_id) for task_id in ids]
        ids = attempts
        step = lambda attempt: attempt.succeed()
    else:
        step = claim
else:
    import psycopg

    ids = claims.bare_runs(warm + count)
    conn = psycopg.connect(claims.database_url(), autocommit=True)
    if variant == "bare-lost":
        for run_id in ids:
            conn.execute(claims.BARE_CLAIM, ["celery@first", run_id])
    if variant == "bare-complete":
        for run_id in ids:
            conn.execute(claims.BARE_CLAIM, ["celery@counted", run_id])
        step = lambda run_id: conn.execute(claims.BARE_COMPLETE, [run_id, "celery@counted"])
    else:
        step = lambda run_id: conn.execute(claims.BARE_CLAIM, ["celery@counted", run_id]).fetchone()
for item in ids[:warm]:
    step(item)
gc.collect()
gc.freeze()
functools.reduce(lambda _, item: step(item), ids[warm:], None)
"""

VARIANTS: Final = (
    ("library-won", "bare-won", "a won claim"),
    ("library-lost", "bare-lost", "a lost claim"),
    ("library-complete", "bare-complete", "a completion"),
)


def instructions(count: int) -> dict[str, float]:
    """The client's instructions per statement of each variant (:data:`VARIANTS`):
    ``count`` of them counted after 50 not counted, in a fresh interpreter each."""
    return {
        variant: collected(LOOP, str(REPO), str(count), variant, toggle="functools_reduce") / count
        for pair in VARIANTS
        for variant in pair[:2]
    }


def print_instructions(count: int) -> None:
    counts = instructions(count)
    print(f"client instructions per statement (callgrind, {count} counted, load independent):")
    for library, bare, what in VARIANTS:
        print(
            f"  {what:13} library {counts[library]:9,.0f}   bare {counts[bare]:9,.0f}   "
            f"{counts[library] / counts[bare]:.2f} x"
            + (" (goal <= 1.5 x)" if "claim" in what else ""),
            flush=True,
        )


def drop_indexes(names: Sequence[str]) -> None:
    """Drop the ledger's indexes ``names`` in the scratch database (``--without-index``)."""
    if not names:
        return
    with psycopg.connect(database_url(), autocommit=True) as conn:
        for name in names:
            if not name.startswith("cdl_"):
                raise SystemExit(f"{name}: not an index of the ledger's (cdl_...)")
            conn.execute(f'DROP INDEX "{name}"')
    print(f"without the indexes {', '.join(names)} (a measurement, not a configuration)")


# -- standalone --------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000, help="runs a round, each variant")
    parser.add_argument("--rounds", type=int, default=4, help="ABBA rounds (0: none)")
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--redelivered", type=float, default=0.05, help="share redelivered")
    parser.add_argument("--lost-batch", type=int, default=500, help="0: no flush check")
    parser.add_argument("--instructions", type=int, default=300, help="0: no callgrind")
    parser.add_argument(
        "--bare-claim-lax",
        action="store_true",
        help="the bare claim commits without waiting for the disk, as the library's does",
    )
    parser.add_argument(
        "--without-index",
        action="append",
        default=[],
        metavar="NAME",
        help="drop this index of the ledger's before the rounds (a measurement of what it "
        "costs a claim, never a configuration: the sweeper, the purge and the console need "
        "them); repeatable",
    )
    args = parser.parse_args()
    if args.bare_claim_lax:  # read by the spawned processes
        os.environ["BENCH_BARE_CLAIM_LAX"] = "1"

    name = f"cd_claims_{uuid.uuid4().hex[:6]}"
    os.environ["BENCH_DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        os.environ["DJANGO_SETTINGS_MODULE"] = "bench.ledger_settings"
        from django.core.management import call_command

        import bench.ledgerapp  # noqa: F401 (Django set up)

        call_command("migrate", verbosity=0)
        drop_indexes(args.without_index)
        figures = None
        if args.rounds:
            figures = compare(args.runs, args.rounds, args.workers, args.redelivered)
        if args.lost_batch:
            lost_claim_flushes(args.lost_batch)
        if args.instructions:
            if shutil.which("valgrind") is None:
                raise SystemExit("valgrind is not installed (apt-get install valgrind)")
            print_instructions(args.instructions)
        if figures is not None:
            print(
                f"claims: celery_claims_per_s {figures.median(LIBRARY):.0f} bare_claims_per_s "
                f"{figures.median(BARE):.0f} celery_claim_ratio {figures.ratio:.3f}"
            )
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
