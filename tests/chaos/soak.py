"""The nemesis soak (reliability plan S2, S11, S12): a workload, faults at seeded random
times, and the external checker of :mod:`tests.support.oracle`.

``python -m tests.chaos.soak [--tier ci|soak] [--seed N]`` (``make chaos``, ``make
chaos-soak``; ``CHAOS_TIER`` and ``CHAOS_SEED`` do the same). Everything it uses is its
own: a Redis broker it starts on a port of its own (6390-6399), a second Redis for the
results, a PostgreSQL database ``chaos_<tier>_<seed>_<pid>`` reached through a TCP proxy
it can cut (on the shared server, or for the ``soak`` and ``postgres`` tiers on a cluster
of its own that it can crash), the provider process (``tests/support/sink.py``), real ``celery
worker`` processes (prefork, acks_late, short visibility timeout and lease) and
producer processes (``tests/chaos/producer.py``).

The **workload** (``tests/support/chaosapp.py``): orders that pay once through the
provider, some after a retry, some losing the provider's reply, some dawdling past a
short deadline on purpose; each paid order publishes its completion notice as a child
run (a delivery task with a provider key of its own), through the outbox.

The **nemesis** deals a seeded, shuffled deck of faults at seeded random intervals:
SIGKILL a pool process; SIGKILL a whole worker (a supervisor starts another); SIGSTOP a
worker past its lease and SIGCONT it later; restart the broker with its data lost
(SIGKILL, its append-only file removed: what a Redis without persistence does) or kept
(SIGKILL, restarted from its ``appendfsync always`` file); cut the database for a few
seconds; crash PostgreSQL (``pg_ctl stop -m immediate``) and start it again, on a
cluster of the soak's own; step a worker's wall clock (the testing seam) and step it
back later.

The **checker** reads only what users see: the provider's log, the callers'
``AsyncResult`` states and the ledger after quiescence. A failure prints the seed, the
history of each run it names and the nemesis schedule; the same seed deals the same
workload and the same faults (their instants against the workers' progress vary).
The last line is the summary: ``trials=N faults=M duplicated=0 lost=0 stuck=0
unexplained=0 stale_accepted=0``.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

KINDS = (
    "pool_kill", "worker_kill", "worker_stop", "broker_restart_lost",
    "broker_restart_aof", "db_cut", "clock_step", "db_restart",
)  # fmt: skip

#: The faults that need no PostgreSQL cluster of the soak's own.
SHARED_CLUSTER_KINDS = tuple(kind for kind in KINDS if kind != "db_restart")

#: Lease TTL of the workers (seconds): a stop lasts longer than it.
TTL = 2.0
#: The budget of an ``expire`` order: far shorter than its dawdle (chaosapp.DAWDLE).
EXPIRE_BUDGET = 3.0


@dataclass(frozen=True)
class Tier:
    runs: int
    faults: dict[str, int]
    seconds: float  # publishing and nemesis both spread over this long
    workers: int = 3
    producers: int = 3
    budget: float = 120.0
    quiesce: float = 120.0
    broker: str = "redis"
    #: deadlines_republish_after of the workers: short, so that lost messages come back
    #: soon; not so short that a backlog on a loaded machine is multiplied by copies
    #: (seed 202, load 29: 20 copies of a run in 2 min, and a plain run expired queued)
    republish_after: float = 3.0
    #: a PostgreSQL cluster of the soak's own (initdb, another port), which ``db_restart``
    #: crashes (``pg_ctl stop -m immediate``) and starts again
    own_postgres: bool = False


TIERS = {
    "ci": Tier(
        runs=320,
        faults={
            "pool_kill": 30,
            "worker_kill": 10,
            "worker_stop": 14,
            "broker_restart_lost": 10,
            "broker_restart_aof": 10,
            "db_cut": 14,
            "clock_step": 20,
        },
        seconds=110.0,
        republish_after=10.0,
    ),
    # RabbitMQ: a node of the soak's own (ports 5680-5689); a restart takes ~20 s here
    "rabbitmq": Tier(
        runs=320,
        faults={
            "pool_kill": 24,
            "worker_kill": 8,
            "worker_stop": 10,
            "broker_restart_lost": 5,
            "broker_restart_aof": 5,
            "db_cut": 10,
            "clock_step": 12,
        },
        seconds=240.0,
        broker="rabbitmq",
        quiesce=180.0,
    ),
    # PostgreSQL crashed and restarted: a cluster of the soak's own (ports 5440-5449)
    "postgres": Tier(
        runs=240,
        faults={"db_restart": 24, "pool_kill": 12, "worker_stop": 6, "broker_restart_lost": 4},
        seconds=120.0,
        own_postgres=True,
    ),
    "smoke": Tier(
        runs=30, faults=dict.fromkeys(SHARED_CLUSTER_KINDS, 1), seconds=15.0, quiesce=60.0
    ),
    # every kind of fault 150 times, PostgreSQL's crash included: a cluster of its own
    "soak": Tier(
        runs=4000,
        faults=dict.fromkeys(KINDS, 150),
        producers=6,
        seconds=2100.0,
        budget=300.0,
        quiesce=300.0,
        own_postgres=True,
    ),
}

FLAVOURS = (("plain", 0.6), ("retry", 0.15), ("ackloss", 0.1), ("expire", 0.15))

#: How each kind of run may end, and be explained (status, reason).
SUCCEEDS = frozenset({("SUCCEEDED", "")})
EXPIRES = frozenset(
    {("EXPIRED", "deadline_passed"), ("EXPIRED", "run_expired"), ("EXPIRED", "delivery_expired")}
)


#: The result-backend states a caller waits through (``get()`` does not return): what a
#: run's earlier moments store before its end (none, a retry, a start, an effect being
#: reconciled).
STILL_WAITING = ("PENDING", "RETRY", "STARTED", "UNKNOWN")
#: A run whose every publish raised (the caller was told): it ended, nothing was sent
#: (the broker or the database failed it, or the enqueue gate refused it for the queue
#: ahead, on by default).
UNSENT = frozenset({("FAILED", "publish_failed"), ("EXPIRED", "queue_backlog")})


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_port(candidates: range | None = None) -> int:
    for port in candidates or range(0):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout} s")
        time.sleep(0.05)


# -- the services the soak owns -----------------------------------------------------------


class Redis:
    """A ``redis-server`` of the soak's own, on its own port and directory."""

    def __init__(self, folder: Path, port: int, aof: bool) -> None:
        self.folder, self.port, self.aof = folder, port, aof
        self.process: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.aof else []
        self.process = subprocess.Popen(
            [
                "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", *persistence, "--dir", str(self.folder),
                "--logfile", str(self.folder / "redis.log"),
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        wait_until(self.ping, 20, f"redis on {self.port} did not answer")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def restart(self, lose: bool) -> None:
        """SIGKILL it and start it again: with its data lost, or from its AOF."""
        self.kill()
        if lose:
            shutil.rmtree(self.folder / "appendonlydir", ignore_errors=True)
        self.start()


def traversable(folder: Path) -> None:
    """Let a server that drops to a user of its own (postgres, rabbitmq) reach its folder
    in the soak's: ``mkdtemp`` made that one root's own (mode 0700)."""
    folder.chmod(folder.stat().st_mode | 0o111)


class Rabbit:
    """A ``rabbitmq-server`` node of the soak's own (never the shared one on 5672): its
    own node name, ports, configuration, database and logs, in ``folder`` (owned by
    the ``rabbitmq`` user, as the server drops to it). A restart SIGKILLs its Erlang VM
    (by its pid file; the host's epmd is left alone) and starts it again, with its
    database (durable queues, persistent messages) kept, or removed: data lost."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder, self.port = folder, port
        self.process: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)
        traversable(folder.parent)
        (folder / "enabled_plugins").write_text("[].\n")
        (folder / "chaos.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{port}\nloopback_users = none\n"
        )
        shutil.chown(folder, "rabbitmq", "rabbitmq")
        for path in folder.iterdir():
            shutil.chown(path, "rabbitmq", "rabbitmq")

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RABBITMQ_NODENAME": f"chaos{self.port}@localhost",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.port + 20000),
            "RABBITMQ_CONFIG_FILE": str(self.folder / "chaos.conf"),
            "RABBITMQ_MNESIA_BASE": str(self.folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.folder / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.folder / "pid"),
        }

    def start(self) -> None:
        (self.folder / "pid").unlink(missing_ok=True)
        with (self.folder / "server.out").open("ab") as out:
            self.process = subprocess.Popen(
                ["rabbitmq-server"], env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        wait_until(self.ping, 120, f"rabbitmq on {self.port} did not answer")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        pid_file = self.folder / "pid"
        if pid_file.exists() and pid_file.read_text().strip():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(30)
        wait_until(lambda: not self.ping(), 30, f"rabbitmq on {self.port} did not stop")

    def restart(self, lose: bool) -> None:
        self.kill()
        if lose:
            shutil.rmtree(self.folder / "mnesia", ignore_errors=True)
        self.start()


PG_BIN = Path("/usr/lib/postgresql/15/bin")


class Postgres:
    """A PostgreSQL cluster of the soak's own: ``initdb`` into ``folder`` as the
    ``postgres`` user (the server refuses root), on its own port; never the shared one."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder, self.port = folder, port
        folder.mkdir(parents=True, exist_ok=True)
        shutil.chown(folder, "postgres", "postgres")
        traversable(folder.parent)
        bin_dir = PG_BIN if PG_BIN.exists() else Path(shutil.which("pg_ctl") or "pg_ctl").parent
        self.pg_ctl, self.initdb = str(bin_dir / "pg_ctl"), str(bin_dir / "initdb")
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *arguments: str) -> None:
        subprocess.run(
            [*self.as_postgres, *arguments], check=True, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, timeout=120,
        )  # fmt: skip

    def init(self) -> None:
        self._run(
            self.initdb, "-D", str(self.folder / "data"), "-A", "trust", "-U", "postgres",
            "--no-sync", "-E", "UTF8",
        )  # fmt: skip
        self.start()

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1"
        self._run(
            self.pg_ctl, "-D", str(self.folder / "data"), "-l", str(self.folder / "pg.log"),
            "-w", "-t", "60", "-o", options, "start",
        )  # fmt: skip

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: no checkpoint, crash recovery at the next start."""
        self._run(self.pg_ctl, "-D", str(self.folder / "data"), "-m", "immediate", "-w", "stop")

    def restart(self) -> None:
        self.crash()
        self.start()

    def kill(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self.crash()


def create_database(name: str, *, port: int = 5432, drop_only: bool = False) -> None:
    import psycopg

    dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    with psycopg.connect(dsn) as conn:
        conn.autocommit = True
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{name}"')


def pids_with_parent(parent: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == parent:
            children.append(int(entry))
    return sorted(children)


# -- the soak -----------------------------------------------------------------------------


@dataclass
class Order:
    task_id: str
    flavour: str
    work: float
    budget: float
    at: float
    producer: int


@dataclass
class Soak:
    tier_name: str
    seed: int
    folder: Path
    tier: Tier = field(init=False)
    rng_nemesis: random.Random = field(init=False)
    schedule: list[dict[str, Any]] = field(default_factory=list)
    injected: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.tier = TIERS[self.tier_name]
        self.prefix = f"chaos{self.seed}"
        self.queue = f"chaos-{self.seed}"
        # one database per run: two soaks on one machine never drop each other's
        self.database = f"chaos_{self.tier_name}_{self.seed}_{os.getpid()}"
        self.rng_nemesis = random.Random(f"{self.seed}:nemesis")
        self.lock = threading.Lock()
        self.workers: list[Any] = []
        self.stopped: set[int] = set()
        self.started_workers = 0
        self.closing = False

    # -- the workload --

    def orders(self) -> list[Order]:
        rng = random.Random(f"{self.seed}:workload")
        names = [name for name, _ in FLAVOURS]
        weights = [weight for _, weight in FLAVOURS]
        found = []
        for index in range(self.tier.runs):
            flavour = rng.choices(names, weights)[0]
            found.append(
                Order(
                    task_id=f"{self.prefix}-{index:05d}",
                    flavour=flavour,
                    work=round(rng.uniform(0.0, 0.6), 3),
                    budget=EXPIRE_BUDGET if flavour == "expire" else self.tier.budget,
                    at=round(rng.uniform(0.0, self.tier.seconds), 3),
                    producer=index % self.tier.producers,
                )
            )
        return sorted(found, key=lambda order: order.at)

    def deck(self) -> list[tuple[float, str]]:
        """The nemesis schedule: (seconds after the start, kind), seeded."""
        kinds = [kind for kind, count in self.tier.faults.items() for _ in range(count)]
        self.rng_nemesis.shuffle(kinds)
        gap = self.tier.seconds / max(1, len(kinds))
        at, dealt = 2.0, []
        for kind in kinds:
            dealt.append((round(at, 3), kind))
            at += self.rng_nemesis.uniform(0.3 * gap, 1.7 * gap)
        return dealt

    # -- setup --

    def setup(self) -> None:
        from tests.support.proxy import Proxy

        self.broker: Redis | Rabbit
        if self.tier.broker == "rabbitmq":
            self.broker = Rabbit(self.folder / "rabbitmq", free_port(range(5680, 5690)))
            broker_url = f"amqp://guest:guest@127.0.0.1:{self.broker.port}//"
        else:
            self.broker = Redis(self.folder / "broker", free_port(range(6390, 6400)), aof=True)
            broker_url = f"redis://127.0.0.1:{self.broker.port}/0"
        self.broker.start()
        self.results = Redis(self.folder / "results", free_port(range(6390, 6400)), aof=False)
        self.results.start()
        self.pg_port = 5432
        self.postgres: Postgres | None = None
        if self.tier.own_postgres:
            self.postgres = Postgres(self.folder / "postgres", free_port(range(5440, 5450)))
            self.postgres.init()
            self.pg_port = self.postgres.port
        create_database(self.database, port=self.pg_port)
        self.direct_url = f"postgres://postgres@127.0.0.1:{self.pg_port}/{self.database}"
        self.proxy = Proxy(("127.0.0.1", self.pg_port))
        self.proxied_url = f"postgres://postgres@127.0.0.1:{self.proxy.port}/{self.database}"
        self.sink_log = self.folder / "provider.jsonl"
        sink_port = free_port()
        self.sink = subprocess.Popen(
            [sys.executable, "-m", "tests.support.sink", str(self.sink_log), str(sink_port)],
            cwd=REPO, stdout=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        assert self.sink.stdout is not None
        self.sink.stdout.readline()
        self.sink_url = f"http://127.0.0.1:{sink_port}"
        os.environ.update(
            {
                "DJANGO_SETTINGS_MODULE": "tests.support.ledger_settings",
                "TEST_DATABASE_URL": self.direct_url,
                "TEST_BROKER_URL": broker_url,
                "TEST_RESULT_BACKEND": f"redis://127.0.0.1:{self.results.port}/0",
                "TEST_QUEUE": self.queue,
                "TEST_SINK": str(self.folder / "tasks-sink.jsonl"),
            }
        )
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        from tests.support.processes import Transport

        self.transport = Transport(
            self.tier.broker, os.environ["TEST_BROKER_URL"], os.environ["TEST_RESULT_BACKEND"]
        )
        self.worker_env = {
            "TEST_DATABASE_URL": self.proxied_url,
            "DJANGO_SETTINGS_MODULE": "tests.support.ledger_settings",
            "TEST_SINK": os.environ["TEST_SINK"],
            "TEST_SINK_URL": self.sink_url,
            "TEST_ACKS_LATE": "1",
            "TEST_REJECT_ON_WORKER_LOST": "1",
            "TEST_VISIBILITY_TIMEOUT": "5",
            "TEST_LEASE_TTL": str(TTL),
            "TEST_REPUBLISH_AFTER": str(self.tier.republish_after),
            "TEST_MAX_LOST_LEASES": "8",
            "TEST_CLOCK_SKEW_BUDGET": "1.0",
        }
        spawned = [self.spawn_worker() for _ in range(self.tier.workers)]
        for worker in spawned:
            worker.wait_ready(120)
        self.workers = spawned

    def spawn_worker(self) -> Any:
        from tests.support.processes import WorkerProcess

        number = self.started_workers
        self.started_workers += 1
        shift = self.folder / f"clock-{number}"
        shift.write_text("0")
        worker = WorkerProcess(
            self.transport, self.queue, self.folder / f"worker-{number}.log",
            concurrency=2, clock_shift_file=shift, app_module="tests.support.chaosapp",
            node=f"{self.queue}-{number}", extra_env=self.worker_env,
        )  # fmt: skip
        return worker.spawn()

    def supervise(self) -> None:
        """Start a worker in place of any that died, as a supervisor would."""
        while not self.closing:
            with self.lock:
                for index, worker in enumerate(self.workers):
                    if worker.process.poll() is not None:
                        self.workers[index] = self.spawn_worker()
            time.sleep(0.5)

    # -- the nemesis --

    def record(self, at: float, kind: str, target: str, detail: str = "") -> None:
        entry = {
            "n": len(self.schedule), "t": round(at, 3), "wall": round(time.time(), 3),
            "kind": kind, "target": target,
        }  # fmt: skip
        if detail:
            entry["detail"] = detail
        self.schedule.append(entry)
        self.injected[kind] += 1

    def nemesis(self, start: float) -> None:
        undo: list[tuple[float, int, str, Any]] = []  # (due, n, kind, action)
        busy: Counter[str] = Counter()

        def run_due(until: float) -> None:
            while undo and undo[0][0] <= until:
                _, _, kind, action = heapq.heappop(undo)
                action()
                busy[kind] -= 1

        for at, kind in self.deck():
            # one fault of each lasting kind at a time: wait for the last one to end
            while busy[kind] > 0:
                run_due(undo[0][0])
                time.sleep(max(0.0, undo[0][0] - time.monotonic()) if undo else 0)
            while time.monotonic() < start + at:
                run_due(time.monotonic())
                time.sleep(min(0.05, max(0.0, start + at - time.monotonic())))
            run_due(time.monotonic())
            later = self.inject(kind, time.monotonic() - start)
            if later is not None:
                seconds, action = later
                heapq.heappush(undo, (time.monotonic() + seconds, len(self.schedule), kind, action))
                busy[kind] += 1
        while undo:
            due, _, kind, action = heapq.heappop(undo)
            time.sleep(max(0.0, due - time.monotonic()))
            action()

    def pick_worker(self) -> tuple[int, Any]:
        with self.lock:
            live = [
                (index, worker)
                for index, worker in enumerate(self.workers)
                if worker.process.poll() is None
            ]
        return self.rng_nemesis.choice(live) if live else (-1, None)

    def inject(self, kind: str, at: float) -> tuple[float, Any] | None:
        rng = self.rng_nemesis
        if kind == "pool_kill":
            _, worker = self.pick_worker()
            pool = pids_with_parent(worker.process.pid) if worker is not None else []
            if pool:
                victim = rng.choice(pool)
                try:
                    os.kill(victim, signal.SIGKILL)
                    self.record(at, kind, worker.node, f"pool pid {victim}")
                except ProcessLookupError:  # it ended meanwhile (its deadline's cap)
                    self.record(at, kind, worker.node, f"pool pid {victim} already gone")
            else:
                self.record(at, kind, "none", "no pool process alive")
            return None
        if kind == "worker_kill":
            _, worker = self.pick_worker()
            if worker is not None:
                with contextlib.suppress(ProcessLookupError):
                    worker.kill()  # the supervisor starts another
            self.record(at, kind, worker.node if worker else "none")
            return None
        if kind == "worker_stop":
            _, worker = self.pick_worker()
            seconds = round(rng.uniform(1.5 * TTL, 3 * TTL), 2)
            self.record(at, kind, worker.node if worker else "none", f"{seconds} s")
            if worker is None:
                return None
            group = worker.process.pid
            _signal_group(group, signal.SIGSTOP)
            return seconds, lambda: _signal_group(group, signal.SIGCONT)
        if kind in ("broker_restart_lost", "broker_restart_aof"):
            lose = kind == "broker_restart_lost"
            self.broker.restart(lose=lose)
            kept = "AOF" if isinstance(self.broker, Redis) else "durable queues kept"
            self.record(
                at, kind, f"{self.tier.broker}:{self.broker.port}", "data lost" if lose else kept
            )
            return None
        if kind == "db_cut":
            seconds = round(rng.uniform(1.0, 4.0), 2)
            self.proxy.block()
            self.record(at, kind, "postgres proxy", f"{seconds} s")
            return seconds, self.proxy.unblock
        if kind == "db_restart":
            if self.postgres is None:
                raise ValueError("db_restart needs a cluster of the soak's own (own_postgres)")
            began = time.time()
            self.postgres.restart()
            took = time.time() - began  # recorded after it: the window is [wall - took, wall]
            self.record(
                at,
                kind,
                f"postgres:{self.postgres.port}",
                f"{took:.2f} s: stop -m immediate, start",
            )
            return None
        if kind == "clock_step":
            _, worker = self.pick_worker()
            step = round(rng.choice((-1, 1)) * rng.uniform(0.2, 30.0), 2)
            seconds = round(rng.uniform(2.0, 8.0), 2)
            self.record(at, kind, worker.node if worker else "none", f"{step:+} s for {seconds} s")
            if worker is None:
                return None
            from tests.support.processes import shift_wall_clock

            path = worker.clock_shift_file
            shift_wall_clock(path, step)
            return seconds, lambda: shift_wall_clock(path, 0)
        raise ValueError(kind)

    # -- the run --

    def publish(self, orders: list[Order]) -> list[subprocess.Popen[bytes]]:
        env = {
            **os.environ,
            "TEST_DATABASE_URL": self.proxied_url,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        producers = []
        for number in range(self.tier.producers):
            plan = self.folder / f"producer-{number}.plan.json"
            mine = [vars(order) for order in orders if order.producer == number]
            plan.write_text(json.dumps(mine))
            out = self.folder / f"producer-{number}.jsonl"
            with (self.folder / f"producer-{number}.log").open("wb") as log_file:
                producers.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "tests.chaos.producer", str(plan), str(out)],
                        cwd=REPO,
                        env=env,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        return producers

    def quiesce(self, ids: set[str]) -> None:
        """Until every run of the soak in the ledger ended and none changed for a while."""
        from django.db import DatabaseError, connections

        from celery_deadlines.models import TERMINAL, Run

        connections.close_all()
        deadline = time.monotonic() + self.tier.quiesce
        last: Any = None
        still_since = time.monotonic()
        while time.monotonic() < deadline:
            rows = Run.objects.filter(task_id__startswith=self.prefix)
            try:
                snapshot = sorted(rows.values_list("task_id", "status", "version"))
            except DatabaseError:  # the checker's connection met a db_restart: reconnect
                connections.close_all()
                time.sleep(0.5)
                continue
            seen = {task_id for task_id, _, _ in snapshot}
            done = ids <= seen and all(status in TERMINAL for _, status, _ in snapshot)
            # a message still queued or held unacked may be the redelivery that tells a
            # waiting caller its run's end (a worker killed after the ledger's end)
            done = done and self.in_flight() == 0
            if snapshot != last or not done:
                last, still_since = snapshot, time.monotonic()
            elif time.monotonic() - still_since >= 3 * TTL:
                return
            time.sleep(0.5)
        log(f"no quiescence within {self.tier.quiesce} s: judging as it stands")

    def in_flight(self) -> int | None:
        """Messages of the soak's queue still in the broker: ready, or delivered and not
        acknowledged (Redis keeps those until a worker acks them or restores them after
        the visibility timeout; RabbitMQ requeues a dead consumer's at once). ``None``
        if the broker could not be asked."""
        from amqp.exceptions import AMQPError
        from kombu import Connection
        from kombu.exceptions import KombuError
        from redis.exceptions import RedisError

        try:
            with Connection(os.environ["TEST_BROKER_URL"], connect_timeout=2) as conn:
                channel: Any = conn.default_channel
                if self.tier.broker != "redis":
                    return int(channel.queue_declare(queue=self.queue, passive=True).message_count)
                # Redis drops an empty list: a passive declare would say the queue is gone
                ready = channel._size(self.queue)  # every priority's list
                return int(ready) + int(channel.client.hlen(channel.unacked_key))
        except (OSError, AMQPError, KombuError, RedisError):  # restarting, or not declared yet
            return None

    def run(self) -> int:
        started = time.monotonic()
        self.setup()
        log(f"seed={self.seed} tier={self.tier_name} folder={self.folder}")
        orders = self.orders()
        supervisor = threading.Thread(target=self.supervise, daemon=True)
        supervisor.start()
        start = time.monotonic()
        producers = self.producers = self.publish(orders)
        self.nemesis(start)
        for producer in producers:
            producer.wait(self.tier.seconds + 300)
        log(f"nemesis done: {sum(self.injected.values())} faults; quiescing")
        acknowledged = self.acknowledged()
        self.quiesce({task_id for task_id, ok in acknowledged.items() if ok})
        verdict, trials = self.judge(orders, acknowledged)
        self.closing = True
        self.teardown()
        failed = self.report(verdict, trials, time.monotonic() - started)
        if self.postgres is not None:
            self.postgres.kill()  # after the report, which reads the failures' histories
        if not failed:  # a failure keeps its database for a look at the ledger
            from django.db import connections

            connections.close_all()
            with contextlib.suppress(Exception):  # the summary stays the last line
                if self.postgres is None:
                    create_database(self.database, drop_only=True)
        return failed

    def acknowledged(self) -> dict[str, bool]:
        found: dict[str, bool] = {}
        for number in range(self.tier.producers):
            path = self.folder / f"producer-{number}.jsonl"
            for entry in read_jsonl(path):
                found[entry["task_id"]] = entry["acknowledged"]
        return found

    def judge(self, orders: list[Order], acknowledged: dict[str, bool]) -> tuple[Any, int]:
        from celery.result import AsyncResult

        from celery_deadlines.models import Run
        from tests.support import chaosapp, oracle

        planned = []
        by_id = {order.task_id: order for order in orders}
        rows = {run.task_id: run for run in Run.objects.filter(task_id__startswith=self.prefix)}
        for order in orders:
            allowed = EXPIRES if order.flavour == "expire" else SUCCEEDS
            if not acknowledged.get(order.task_id, False):
                allowed = allowed | UNSENT  # its caller was told the publish failed
            planned.append(
                oracle.Planned(
                    order.task_id,
                    chaosapp.pay_key(order.task_id, order.flavour),
                    acknowledged=acknowledged.get(order.task_id, False),
                    allowed=allowed,
                )
            )
            child = chaosapp.notice_id(order.task_id)
            parent = rows.get(order.task_id)
            if child in rows or (parent is not None and parent.status == "SUCCEEDED"):
                # a paid order's notice must exist and be delivered
                planned.append(
                    oracle.Planned(
                        child, chaosapp.notice_key(order.task_id), allowed=SUCCEEDS | EXPIRES
                    )
                )
        self.rows = rows
        ledger = {task_id: ledgered(run) for task_id, run in rows.items()}
        callers = {
            run.task_id: AsyncResult(run.task_id, app=chaosapp.app).state
            for run in planned
            if run.task_id in rows
        }
        self.calls = read_jsonl(self.sink_log)
        verdict = oracle.check(planned, ledger, self.calls, [], SUCCEEDS, callers=callers)
        self.unstored = self.unstored_after_success(verdict)
        self.outage_failed = self.failed_during_outages(verdict, rows)
        self.db_retried, self.replayed = retried_for_the_database(orders, rows)
        unknown = [task_id for task_id in rows if task_id.split(".")[0] not in by_id]
        verdict.unexpected.extend(f"run {task_id}" for task_id in unknown)
        return verdict, len(orders)

    def unstored_after_success(self, verdict: Any) -> list[str]:
        """The runs of ``disagreeing`` the ledger says SUCCEEDED whose caller still sees
        a waiting state (:data:`STILL_WAITING`: what an earlier moment of the run stored,
        a retried attempt's RETRY for one) *after the nemesis killed the process that
        completed it*: the window between ``succeed()`` and Celery storing the result,
        which the kept result closes (issue 31). Each is named with the kill as evidence;
        it stays a violation."""

        def evidence(entry: str) -> str | None:
            event = last_applied(entry.split(":")[0], "succeeded")
            waiting = any(
                entry.endswith(f"SUCCEEDED, the caller {state}") for state in STILL_WAITING
            )
            if not waiting or event is None:
                return None
            node, _, pid = event.owner.rpartition(":")
            node = node.split("@")[0]
            for fault in self.schedule:
                after = fault["wall"] >= event.at.timestamp() - 0.05
                killed = (
                    fault["kind"] == "pool_kill" and fault.get("detail") == f"pool pid {pid}"
                ) or (fault["kind"] == "worker_kill" and fault["target"] == node)
                if after and killed:
                    return f"completed by {event.owner}, then fault {fault}"
            return None

        return with_evidence(verdict.disagreeing, evidence)

    def failed_during_outages(self, verdict: Any, rows: dict[str, Any]) -> list[str]:
        """The runs of ``unexplained`` that ended FAILED with the database connection's
        error *while the nemesis had the database cut, or crashed and restarting*: the
        library's writes wait a cut out and the workload's orders retry their own
        (docs/howto/database-outage.md), so each is a bug. Named with the
        fault as evidence; it stays a violation."""
        outages = []
        for fault in self.schedule:
            if fault["kind"] == "db_cut":  # recorded as it began
                seconds = float(fault["detail"].split()[0])
                outages.append((fault["wall"] - 0.5, fault["wall"] + seconds + 1.0, fault))
            elif fault["kind"] == "db_restart":  # recorded once the server was back
                took = float(fault["detail"].split()[0])
                outages.append((fault["wall"] - took - 0.5, fault["wall"] + 1.0, fault))

        def evidence(entry: str) -> str | None:
            run = rows.get(entry.split(":")[0])
            if run is None or run.status != "FAILED":
                return None
            if not run.detail.startswith(("OperationalError(", "InterfaceError(")):
                return None
            event = last_applied(run.task_id, "failed")
            if event is None:
                return None
            at = event.at.timestamp()
            for start, end, fault in outages:
                if start <= at <= end:
                    return f"{run.detail[:60]}..., during fault {fault}"
            return None

        return with_evidence(verdict.unexplained, evidence)

    def teardown(self) -> None:
        for worker in self.workers:
            _signal_group(worker.process.pid, signal.SIGCONT)
            worker.kill()
        self.proxy.close()
        self.sink.kill()
        self.broker.kill()
        self.results.kill()

    def report(self, verdict: Any, trials: int, seconds: float) -> int:
        found = verdict.violations()
        faults = sum(self.injected.values())
        (self.folder / "nemesis.jsonl").write_text(
            "".join(json.dumps(entry) + "\n" for entry in self.schedule)
        )
        if found:
            log(f"FAILED: seed {self.seed}; replay: python -m tests.chaos.soak "
                f"--tier {self.tier_name} --seed {self.seed}")  # fmt: skip
            for name, entries in found.items():
                for entry in entries[:20]:
                    log(f"{name}: {entry}")
                    self.history(entry.split(":")[0].removeprefix("run "))
            log("nemesis schedule:")
            for entry in self.schedule:
                print(json.dumps(entry), flush=True)
            log(f"logs kept in {self.folder}")
        for entry in self.unstored:
            log(f"result not stored after succeed(): {entry}")
        for entry in self.outage_failed:
            log(f"failed during a database outage: {entry}")
        per_kind = " ".join(f"{kind}={self.injected[kind]}" for kind in KINDS)
        ended = Counter(f"{run.status}/{run.reason or '-'}" for run in self.rows.values())
        log(f"faults: {per_kind}")
        log(f"runs in the ledger: {dict(sorted(ended.items()))}; provider calls: {len(self.calls)}")
        log(
            f"also: mismatched={len(verdict.mismatched)} overran={len(verdict.overran)} "
            f"disagreeing={len(verdict.disagreeing)} unexpected={len(verdict.unexpected)} "
            f"result_unstored_after_success={len(self.unstored)} "
            f"failed_during_db_cut={len(self.outage_failed)} "
            f"retried_for_the_database={self.db_retried} (payment replayed: {self.replayed}); "
            f"seed={self.seed} tier={self.tier_name} {seconds:.0f} s"
        )
        print(
            f"trials={trials} faults={faults} duplicated={len(verdict.duplicated)} "
            f"lost={len(verdict.lost)} stuck={len(verdict.stuck)} "
            f"unexplained={len(verdict.unexplained)} "
            f"stale_accepted={len(verdict.stale_accepted)}",
            flush=True,
        )
        return 1 if found else 0

    def history(self, task_id: str) -> None:
        from celery_deadlines.models import RunEvent

        events = RunEvent.objects.filter(run__task_id=task_id).order_by("id")
        for event in events:
            print(
                f"    {event.at:%H:%M:%S.%f} {event.kind} {event.outcome} {event.status} "
                f"{event.reason} t{event.lease_token} {event.owner} {event.detail[:120]}",
                flush=True,
            )
        for call in self.calls:
            if call.get("task_id") == task_id:
                print(f"    provider: {json.dumps(call)}", flush=True)


def _signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signum)


def ledgered(run: Any) -> Any:
    from tests.support import oracle

    effect = run.effects.order_by("id").first()
    claims = tuple(
        (event.lease_token, event.at.timestamp())
        for event in run.events.filter(kind="claim", outcome="applied")
    )
    return oracle.Ledgered(
        run.status, run.reason, run.is_terminal,
        effect.state if effect else None, effect.lease_token if effect else None,
        deadline=run.deadline.timestamp() if run.deadline else None, claims=claims,
    )  # fmt: skip


def with_evidence(entries: list[str], evidence: Callable[[str], str | None]) -> list[str]:
    """The ``entries`` ``evidence`` has something to say about, each with it."""
    found = ((entry, evidence(entry)) for entry in entries)
    return [f"{entry}: {why}" for entry, why in found if why is not None]


def retried_for_the_database(orders: list[Order], rows: dict[str, Any]) -> tuple[int, int]:
    """How many orders retried more often than their flavour does (the retries that
    ``autoretry_for`` Django's connection errors made), and how many of those had paid
    before a later attempt succeeded (their payment replayed from the effect ledger)."""
    from celery_deadlines.models import Effect

    planned = {order.task_id: 1 if order.flavour == "retry" else 0 for order in orders}
    retried = [
        run for task_id, run in rows.items() if run.retries > planned.get(task_id, run.retries)
    ]
    paid_by = dict(
        Effect.objects.filter(run__in=retried, name="pay", state="SUCCEEDED").values_list(
            "run_id", "lease_token"
        )
    )
    replayed = sum(
        1
        for run in retried
        if run.status == "SUCCEEDED" and paid_by.get(run.id, run.lease_token) < run.lease_token
    )
    return len(retried), replayed


def last_applied(task_id: str, kind: str) -> Any:
    """The run's last applied event of ``kind``, or ``None``."""
    from celery_deadlines.models import RunEvent

    return (
        RunEvent.objects.filter(run__task_id=task_id, kind=kind, outcome="applied")
        .order_by("id")
        .last()
    )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tier", default=os.environ.get("CHAOS_TIER", "ci"), choices=TIERS)
    parser.add_argument("--seed", type=int, default=os.environ.get("CHAOS_SEED"))
    parser.add_argument("--folder", default=os.environ.get("CHAOS_FOLDER"))
    options = parser.parse_args()
    seed = options.seed if options.seed is not None else random.randrange(1, 10**6)
    folder = Path(options.folder or tempfile.mkdtemp(prefix=f"chaos-{seed}-"))
    folder.mkdir(parents=True, exist_ok=True)
    soak = Soak(options.tier, int(seed), folder)
    # a CI timeout's SIGTERM (or SIGINT, ignored in background jobs) stops what it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return soak.run()
    finally:
        soak.closing = True
        for worker in soak.workers:
            _signal_group(worker.process.pid, signal.SIGKILL)
        for name in ("broker", "results", "postgres"):
            server = getattr(soak, name, None)
            if server is not None:
                server.kill()
        for process in [getattr(soak, "sink", None), *getattr(soak, "producers", [])]:
            if process is not None and process.poll() is None:
                process.kill()


if __name__ == "__main__":
    sys.exit(main())
