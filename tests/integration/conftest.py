"""Integration fixtures: real brokers, real result stores, real worker processes.

Services are required in CI (``CI=true``) and skipped with a clear message on a laptop
that lacks them. Each test gets its own queue, so leftovers never leak between tests.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kombu.pools
import pytest
from django.db import connections

from demo_project.broker import TRANSPORT
from tests.conftest import service_unavailable
from tests.support import isolation
from tests.support.processes import REPO, Transport, WorkerProcess, reachable

pytestmark = pytest.mark.integration

REDIS = (isolation.REDIS_HOST, isolation.REDIS_PORT)
RABBITMQ = ("127.0.0.1", 5672)


#: The Redis databases of the broker (this xdist worker's) and the result backend; two
#: suites on one machine (or a suite and a benchmark) set their own, so that neither
#: restores or flushes the other's messages (tests/support/isolation.py).
REDIS_BROKER = isolation.REDIS_BROKER
REDIS_RESULTS = isolation.REDIS_RESULTS


def redis_transport() -> Transport:
    return Transport("redis", REDIS_BROKER, REDIS_RESULTS, *REDIS)


def rabbitmq_transport() -> Transport:
    return Transport("rabbitmq", "amqp://guest:guest@127.0.0.1:5672//", REDIS_RESULTS, *RABBITMQ)


def filesystem_transport(tmp: Path) -> Transport:
    folder = tmp / "broker"
    folder.mkdir()
    (tmp / "broker-control").mkdir()
    (tmp / "results").mkdir()
    return Transport(
        "filesystem", "filesystem://", f"file://{tmp / 'results'}", fs_folder=str(folder)
    )


def require(transport: Transport) -> None:
    needed = [(transport.host, transport.port)] if transport.host and transport.port else []
    if transport.result_backend.startswith("redis://"):
        needed.append(REDIS)
    for host, port in needed:
        if host is not None and port is not None and not reachable(host, port):
            service_unavailable(f"{transport.name}: {host}:{port}")


def transport_named(name: str, folder: Path) -> Transport:
    """The transport called ``name`` (a filesystem broker lives in ``folder``)."""
    if name == "filesystem":
        return filesystem_transport(folder)
    return redis_transport() if name == "redis" else rabbitmq_transport()


#: The transports whose own properties a test may depend on (queue delay, headers).
TRANSPORTS = ["redis", "rabbitmq", "filesystem"]


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest, tmp_path: Path) -> Transport:
    chosen = transport_named(request.param, tmp_path)
    require(chosen)
    return chosen


@pytest.fixture
def redis() -> Transport:
    chosen = redis_transport()
    require(chosen)
    return chosen


@pytest.fixture
def queue() -> str:
    return isolation.queue_name(f"it-{uuid.uuid4().hex[:10]}")


@pytest.fixture
def client(transport: Transport, queue: str) -> Iterator[Any]:
    """The test app, configured for ``transport`` and the test's own queue, in this process."""
    yield from _client(transport, queue)


@pytest.fixture
def redis_client(redis: Transport, queue: str) -> Iterator[Any]:
    yield from _client(redis, queue)


def _client(transport: Transport, queue: str) -> Iterator[Any]:
    with client_for(transport, queue) as app:
        yield app


@contextmanager
def client_for(transport: Transport, queue: str, app: Any = None) -> Iterator[Any]:
    """The test app (or ``app``) in this process, publishing to ``transport`` and
    ``queue`` meanwhile."""
    if app is None:
        from tests.support import workerapp

        app = workerapp.app
    saved = {
        key: app.conf[key]
        for key in (
            "broker_url",
            "result_backend",
            "task_default_queue",
            "broker_transport_options",
            "broker_transport",
        )
    }
    options: dict[str, Any] = {}
    if transport.fs_folder:
        options = {
            "data_folder_in": transport.fs_folder,
            "data_folder_out": transport.fs_folder,
            "control_folder": transport.fs_folder + "-control",
            "polling_interval": 0.1,  # as the workers poll (tests/support/workerapp.py)
        }
    app.conf.update(
        broker_url=transport.broker_url,
        result_backend=transport.result_backend,
        task_default_queue=queue,
        broker_transport_options=options,
        broker_transport=TRANSPORT if transport.fs_folder else None,
    )
    _reset_connections(app)
    try:
        yield app
    finally:
        app.conf.update(saved)
        _reset_connections(app)


def _reset_connections(app: Any) -> None:
    """Close every connection the client holds, so the next publish uses the new config.

    kombu keeps connection pools in a global registry keyed by URL: ``pools.reset()``
    closes them *and* empties the registry (a closed pool must not be handed out again).
    """
    backend = app._local.__dict__.pop("backend", None)
    if backend is not None:
        consumer = getattr(backend, "result_consumer", None)
        if consumer is not None and getattr(consumer, "_pubsub", None) is not None:
            consumer.stop()
        # a Redis backend's client (the cache backend's in-memory one, left by a test
        # that used the app as configured at import, has no pool)
        pool = getattr(backend.__dict__.get("client"), "connection_pool", None)
        if pool is not None:
            pool.disconnect()
    kombu.pools.reset()
    app._pool = None
    app.__dict__.pop("amqp", None)


@pytest.fixture
def start_worker(tmp_path: Path, queue: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Start real ``celery worker`` subprocesses; all are stopped after the test."""
    started: list[WorkerProcess] = []

    def start(transport: Transport, **options: Any) -> WorkerProcess:
        worker = WorkerProcess(transport, queue, tmp_path / f"worker-{len(started)}.log", **options)
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.kill()  # its shutdown is not under test: a warm one costs a second or more
    for broker_url in {worker.transport.broker_url for worker in started}:
        if broker_url.startswith("redis://"):
            forget_unacked(broker_url, queue)
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for worker in started:
            print(f"--- {worker.log_path.name} ---\n{worker.log()}")


# -- shared workers: one per module for the tests that need no topology of their own ------


@dataclass
class Shared:
    """A worker that several tests of a module share, on its own queue."""

    transport: Transport
    queue: str
    worker: WorkerProcess
    folder: Path


class SharedWorkers:
    """Workers a module's tests share when they need no topology of their own (Celery's
    own t/integration rule): each is started on first use, under a name, and stopped
    when the module ends. Tests that publish before a worker exists, kill a whole worker,
    or need a pool of a given size keep workers of their own (``start_worker``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: dict[str, Shared] = {}

    def get(
        self, name: str, start: Callable[[Path, str], tuple[Transport, WorkerProcess]]
    ) -> Shared:
        """The worker called ``name``, started by ``start(folder, queue)`` if it is not yet."""
        if name not in self.started:
            folder = self.folder / name
            folder.mkdir()
            queue = isolation.queue_name(f"shared-{uuid.uuid4().hex[:10]}")
            transport, worker = start(folder, queue)
            self.started[name] = Shared(transport, queue, worker.start(), folder)
        return self.started[name]

    def stop(self) -> None:
        for shared in self.started.values():
            shared.worker.kill()  # its shutdown is not under test
        for shared in self.started.values():
            if shared.transport.broker_url.startswith("redis://"):
                forget_unacked(shared.transport.broker_url, shared.queue)


@pytest.fixture(scope="module")
def shared_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedWorkers]:
    workers = SharedWorkers(tmp_path_factory.mktemp("shared-workers"))
    yield workers
    workers.stop()


@contextmanager
def logs_on_failure(request: pytest.FixtureRequest, *workers: WorkerProcess) -> Iterator[None]:
    """Print what ``workers`` logged during the test if it failed (a shared worker's log
    holds every test's lines: only this test's are printed)."""
    offsets = [len(worker.log()) for worker in workers]
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for worker, offset in zip(workers, offsets, strict=True):
            print(f"--- {worker.log_path.name} (this test's lines) ---\n{worker.log()[offset:]}")


# -- the ledger's tests: PostgreSQL, ledger workers, the provider process ----------------

#: The database alias of the ledger's integration tests (tests/settings.py).
LEDGER_DB = "postgres"


def unacked_of(client: Any, queue: str) -> list[str]:
    """The delivery tags kombu's Redis transport holds unacknowledged for ``queue``.

    The ``unacked`` hash is shared by every queue of the database; each value is the
    JSON ``[message, exchange, routing_key]`` (routing key = queue name here).
    """
    return [
        tag.decode() if isinstance(tag, bytes) else tag
        for tag, value in client.hgetall("unacked").items()
        if json.loads(value)[2] == queue
    ]


def forget_unacked(broker_url: str, queue: str) -> None:
    """Drop a finished test's unacknowledged messages (from workers it killed), so that
    no later test's worker restores them into a queue nobody consumes any more."""
    import redis as redis_py

    with redis_py.Redis.from_url(broker_url) as client:
        tags = unacked_of(client, queue)
        if tags:
            client.hdel("unacked", *tags)
            client.zrem("unacked_index", *tags)


def provider_calls(log: Path, key: str) -> list[dict[str, Any]]:
    """Every call the provider process logged for ``key`` (accepted and refused)."""
    if not log.exists():
        return []
    return [e for e in map(json.loads, log.read_text().splitlines()) if e["key"] == key]


def ended(task_id: str) -> Any:
    """The run of ``task_id`` in the ledger once it is terminal, else ``None``."""
    from celery_deadlines.models import Run

    run = Run.objects.using(LEDGER_DB).filter(task_id=task_id).first()
    return run if run is not None and run.is_terminal else None


def ledger_database_url() -> str:
    """The PostgreSQL test database, as worker subprocesses reach it (TEST_DATABASE_URL)."""
    database = connections[LEDGER_DB].settings_dict
    return f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}"


@pytest.fixture
def postgres() -> None:
    """PostgreSQL is required (skipped with a reason on a laptop without it)."""
    if not reachable("127.0.0.1", 5432):
        service_unavailable("PostgreSQL 127.0.0.1:5432")


@pytest.fixture
def sink(tmp_path: Path) -> Path:
    return tmp_path / "sink.jsonl"


@pytest.fixture(params=["redis", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> Transport:
    chosen = redis_transport() if request.param == "redis" else rabbitmq_transport()
    require(chosen)
    return chosen


@pytest.fixture
def redis_broker(redis: Transport) -> Transport:
    """Redis, under the name the ledger's tests use beside ``broker``."""
    return redis


@pytest.fixture
def ledger_client(queue: str) -> Iterator[Callable[[Transport], Any]]:
    """The ledger app in this process, publishing to ``transport`` and the test's queue."""
    from tests.support import ledgerapp

    app = ledgerapp.app
    saved = {key: app.conf[key] for key in ("broker_url", "result_backend", "task_default_queue")}
    saved_db = app.conf.deadlines_database

    def configure(transport: Transport) -> Any:
        app.conf.update(
            broker_url=transport.broker_url,
            result_backend=transport.result_backend,
            task_default_queue=queue,
            deadlines_database=LEDGER_DB,
        )
        _reset_connections(app)
        return ledgerapp

    yield configure
    app.conf.update(saved, deadlines_database=saved_db)
    _reset_connections(app)


class LedgerWorkers:
    """Starts ledger workers for one test (``env`` adds TEST_* knobs)."""

    #: the worker's app: the ledger app, or a module that adds tasks to it
    app_module = "tests.support.ledgerapp"

    def __init__(self, tmp_path: Path, queue: str, sink: Path) -> None:
        self.tmp_path, self.queue, self.sink = tmp_path, queue, sink
        self.started: list[WorkerProcess] = []
        self.url = ledger_database_url()

    def __call__(
        self,
        transport: Transport,
        concurrency: int = 1,
        *,
        worker_args: tuple[str, ...] = (),
        pool: str = "prefork",
        **env: str,
    ) -> WorkerProcess:
        """One worker, ready (``worker_args``: more arguments of ``celery worker``)."""
        return self.spawn(transport, concurrency, worker_args, pool=pool, **env).wait_ready()

    def together(
        self, count: int, transport: Transport, concurrency: int = 1, **env: str
    ) -> list[WorkerProcess]:
        """``count`` alike workers, started side by side, all ready."""
        workers = [self.spawn(transport, concurrency, (), **env) for _ in range(count)]
        return [worker.wait_ready() for worker in workers]

    def spawn(
        self,
        transport: Transport,
        concurrency: int,
        worker_args: tuple[str, ...],
        *,
        pool: str = "prefork",
        **env: str,
    ) -> WorkerProcess:
        worker = WorkerProcess(
            transport,
            self.queue,
            self.tmp_path / f"ledger-worker-{len(self.started)}.log",
            concurrency=concurrency,
            pool=pool,
            app_module=self.app_module,
            node=f"{self.queue}-{len(self.started)}",
            extra_env={
                "TEST_DATABASE_URL": self.url,
                "TEST_SINK": str(self.sink),
                "DJANGO_SETTINGS_MODULE": "tests.support.ledger_settings",
                **env,
            },
            extra_args=worker_args,
        )
        self.started.append(worker)
        return worker.spawn()


@pytest.fixture
def ledger_worker(
    tmp_path: Path, queue: str, sink: Path, request: pytest.FixtureRequest
) -> Iterator[LedgerWorkers]:
    """Start ledger workers; all are killed after the test."""
    workers = LedgerWorkers(tmp_path, queue, sink)
    yield workers
    started = workers.started
    for worker in started:
        worker.kill()  # its shutdown is not under test: a warm one costs a second or more
    for broker_url in {worker.transport.broker_url for worker in started}:
        if broker_url.startswith("redis://"):
            forget_unacked(broker_url, queue)
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for worker in started:
            print(f"--- {worker.log_path.name} ---\n{worker.log()}")


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The sink as a process of its own (the provider): its URL and its call log."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "provider.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.sink", str(log), str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert "ready" in process.stdout.readline()
    yield f"http://127.0.0.1:{port}", log
    process.terminate()
    process.wait(10)
    process.stdout.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)
