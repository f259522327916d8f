"""Every row's scenario on a real worker, and what it observed from the outside.

:func:`run_rows` runs the rows of a session side by side, a few at a time (``slots``),
each with a worker of its own (the serializers' scenarios share one, which accepts the
three) on a ledger database of its own while it runs (one of ``slots`` copies of the
session's test database, emptied between rows: a worker's reconciler acts on its whole
ledger, so two rows never share one at once). For each
row it configures the test process's project as the row's worker runs it, publishes the
refusal probe and leaves it queued past its deadline, starts the worker (``celery -A
tests.matrix.config.celery_app worker`` with the row's settings, pool and arguments),
publishes the other probes (the order through the project's view, under
``ATOMIC_REQUESTS``), waits for every one to end, and gathers the witnesses: each
probe's ``AsyncResult``, its run, events and effects in the ledger, the provider's
calls, the bodies' notes, ``manage.py deadlines explain`` of the order, and the
worker's log. The eager row runs the same probes in this process.

Every wait has a ceiling derived from the budget of the probe it waits for: its deadline
and :data:`LATE`. A row whose wait reaches its ceiling, or whose worker does not start,
fails with what each probe's caller and the ledger saw and the worker's log.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import kombu.pools
from celery.result import EagerResult
from django.core.management import call_command
from django.db import connections
from django.test import Client, override_settings

from tests.support import isolation
from tests.support.processes import Transport, WorkerProcess

from . import rows
from .orders.views import ORDER_BUDGET
from .rows import Row

#: The probes' budgets (s): each long enough for its work on a busy machine, short
#: enough that what it tests comes within the scenario.
REFUSAL_BUDGET = 0.3
RETRY_BUDGET = 5.0
MAX_RETRIES_BUDGET = 8.0
OVERRUN_BUDGET = 2.0
#: how long the overrun probe works on past its deadline when nothing stops it
OVERRUN_PAST = 1.5
OWN_LIMIT_BUDGET = 15.0
#: how long the own-limit probe works: beyond the project's hard limit, within its deadline
OWN_LIMIT_WORK = rows.SHORT_LIMITS[0] + 2.0

#: How long after its deadline each probe's outcome must be known, whatever the
#: configuration does: by then the ledger has ended its run (the reconciler passes every
#: half second: ``CELERY_DEADLINES_RECONCILE_INTERVAL``) and told its caller, or the row
#: fails. The overrun's body may work on past its deadline (the pools that stop nothing).
WITHIN = {
    "refusal": REFUSAL_BUDGET,
    "order": float(ORDER_BUDGET),
    "child": float(ORDER_BUDGET),
    "retry-refused": RETRY_BUDGET,
    "max-retries": MAX_RETRIES_BUDGET,
    "own-limit": OWN_LIMIT_BUDGET,
    "overrun": OVERRUN_BUDGET + OVERRUN_PAST,
}
#: What a busy machine adds to those: twenty of the reconciler's passes. Reached only
#: when a promise does not hold (a probe that does not end).
LATE = 10.0
#: The overrun body's last step, from its note past the deadline to its last note (an
#: effect and a call refused, or made): how long to look for that note after the instant
#: a body that runs on writes it, before concluding that the body was stopped.
LAST_STEP = 1.0
#: How long a worker may take to start, beside the other rows' (its imports, Django's
#: set-up and its pool's processes, on a loaded machine): not a budget under test, the
#: ceiling of a worker that cannot start.
START = 120.0
#: How often the waits look.
POLL = 0.1


@dataclass
class Probe:
    """One published task: what its caller, the ledger and the witnesses saw."""

    name: str
    key: str
    task_id: str | None = None
    state: str | None = None
    #: the exception's class name and its text, when the caller got one
    error: str | None = None
    error_text: str = ""
    value: Any = None
    #: the error this process got from publishing or running it (the eager row)
    raised: str | None = None
    run: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    effects: list[dict[str, Any]] = field(default_factory=list)
    notes: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    #: how its message was encoded, read while it waits in a Redis queue (the refusal)
    content_type: str | None = None
    #: the monotonic instant its outcome is due by (its deadline and LATE)
    due: float = 0.0
    #: whether its caller has its outcome and its run has ended (see ``_ended``)
    ended: bool = False

    def noted(self, kind: str) -> list[dict[str, Any]]:
        return [n for n in self.notes if n["kind"] == kind]


@dataclass
class Observed:
    row: Row
    serializer: str
    probes: dict[str, Probe]
    #: the order's child (the charge), as its own probe
    child: Probe | None
    explain: str
    log: str
    #: the row's worker's reports of what it holds on its queue (core/workload.py),
    #: read while it runs: field, ``seq held received started``
    workload: dict[bytes, bytes] = field(default_factory=dict)

    def told(self) -> str:
        """What every probe's caller and the ledger saw, for a failure's message."""
        probes = [*self.probes.values(), *([self.child] if self.child else [])]
        return "\n".join(_told(probe) for probe in probes)


def _told(probe: Probe) -> str:
    caller = probe.state or "not published"
    if probe.error or probe.raised:
        caller += f" {probe.error or probe.raised}: {probe.error_text[:300]}"
    ledger = "no run"
    if probe.run is not None:
        ledger = (
            f"{probe.run['status']} {probe.run['reason'] or ''} attempt {probe.run['attempt']}"
            f"; events {[(e['kind'], e['outcome'], e['status']) for e in probe.events]}"
        )
    notes = [n["kind"] for n in probe.notes]
    return (
        f"{probe.name} ({probe.task_id}): the caller sees {caller}; the ledger: {ledger}; "
        f"the body noted {notes}; the provider got {[c['outcome'] for c in probe.calls]}"
    )


def ledger_database_url() -> str:
    database = connections["default"].settings_dict
    return (
        f"postgres://{database['USER']}@{database['HOST']}:{database['PORT'] or 5432}/"
        f"{database['NAME']}"
    )


@contextmanager
def configured(app: Any, row: Row, queue: str, serializer: str) -> Iterator[dict[str, str]]:
    """The test process's project as the row's worker runs it (its Celery settings,
    broker, queue and serializer) meanwhile, set as the project sets them: Django
    settings in the ``CELERY`` namespace; yields the worker's environment.

    Not ``app.conf.update``: under a namespace, Celery 5.5 and 5.6 look a setting up by
    its prefixed name first in every layer, so the Django setting hides the update
    (5.7 looks in the update first). The tasks are bound again to the settings (Celery
    copies the serializer, and from 5.7 the time limits, onto a task class when it binds
    it, and a publisher puts them in the message)."""
    broker = rows.amqp_url() if row.broker == "rabbitmq" else rows.redis_url()
    eager = row.settings_module == "local"
    changes: dict[str, Any] = {
        "CELERY_BROKER_URL": broker,
        "CELERY_RESULT_BACKEND": rows.redis_url(),
        "CELERY_TASK_DEFAULT_QUEUE": queue,
        "CELERY_TASK_SERIALIZER": serializer,
        "CELERY_RESULT_SERIALIZER": "json",
        "CELERY_TASK_ALWAYS_EAGER": eager,
        "CELERY_TASK_EAGER_PROPAGATES": eager,
        **{name: value for name, value in row.settings.items() if name.startswith("CELERY_")},
    }
    try:
        with override_settings(**changes):
            _reset(app)
            yield {
                "CELERY_BROKER_URL": broker,
                "CELERY_RESULT_BACKEND": rows.redis_url(),
                "MATRIX_QUEUE": queue,
                "MATRIX_SETTINGS": json.dumps(row.settings),
                "DATABASE_URL": ledger_database_url(),
                "DJANGO_SETTINGS_MODULE": f"tests.matrix.config.settings.{row.settings_module}",
            }
    finally:
        _reset(app)


def _reset(app: Any) -> None:
    """Close the app's connections, so that the next publish follows its configuration,
    and bind the project's tasks to it again."""
    backend = app._local.__dict__.pop("backend", None)
    pool = getattr(getattr(backend, "client", None), "connection_pool", None)
    if pool is not None:
        pool.disconnect()
    kombu.pools.reset()
    app._pool = None
    app.__dict__.pop("amqp", None)
    for name, task in app.tasks.items():
        if name.startswith("orders."):
            _rebind(app, type(task))
            task.__dict__.pop("_exec_options", None)  # the options a publish last read


def _rebind(app: Any, cls: Any) -> None:
    """Bind a task class again, as Celery binds it: each option the task leaves to the
    configuration (``from_config``: none is set in tasks.py nor on DeadlineTask) read
    from it anew."""
    base = cls.__mro__[1]
    for attribute, _setting in cls.from_config:
        if getattr(base, attribute, None) is None:
            setattr(cls, attribute, None)
    for attribute in ("acks_on_failure", "acks_on_timeout"):  # derived by bind (5.7)
        if hasattr(cls, attribute) and getattr(base, attribute, None) is None:
            setattr(cls, attribute, None)
    cls.bind(app)


@contextmanager
def database_settings(row: Row, name: str | None) -> Iterator[None]:
    """The row's settings of the default alias (its database, pool, CONN_MAX_AGE) in
    this process meanwhile; ``name`` None keeps the session's database."""
    alias = connections["default"].settings_dict
    changed = {
        key.split("__", 2)[2]: value
        for key, value in row.settings.items()
        if key.startswith("DATABASES__default__")
    }
    if name is not None:
        changed["NAME"] = name
    saved = {key: alias.get(key) for key in changed}
    connections["default"].close()
    alias.update(changed)
    try:
        yield
    finally:
        connections["default"].close()
        if changed.get("OPTIONS", {}).get("pool"):
            connections["default"].close_pool()  # type: ignore[attr-defined]
        alias.update(saved)


@dataclass
class Flight:
    """One row in flight: its ledger database, its worker, its scenarios (one per
    serializer), and where it stands (``stage``)."""

    row: Row
    probes: tuple[str, ...]
    folder: Path
    #: its ledger (a slot's: None for the eager row, which has no worker and uses the
    #: session's database)
    ledger: Ledger | None = None
    queue: str = ""
    scenarios: dict[str, dict[str, Probe]] = field(default_factory=dict)
    children: dict[str, Probe] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    worker: WorkerProcess | None = None
    stage: str = "new"
    spawn_at: float = 0.0
    started_at: float = 0.0
    observed: dict[str, Observed] = field(default_factory=dict)
    failure: str | None = None
    #: the monotonic instant each stage began (for the session's timeline)
    instants: dict[str, float] = field(default_factory=dict)

    def enter(self, stage: str) -> None:
        self.stage = stage
        self.instants[stage] = time.monotonic()

    def timeline(self) -> str:
        """When each stage began, from the row's start (s)."""
        start = self.instants.get("queued", 0.0)
        return " ".join(f"{stage} {at - start:.1f}" for stage, at in self.instants.items())

    @property
    def eager(self) -> bool:
        return self.row.settings_module == "local"

    @property
    def database(self) -> str | None:
        return None if self.ledger is None else self.ledger.database

    @property
    def alias(self) -> str:
        """The alias this process reads the row's ledger through while it waits."""
        return "default" if self.ledger is None else self.ledger.alias

    @property
    def notes(self) -> Path:
        return self.folder / "notes.jsonl"

    def waiting(self) -> list[tuple[str, Probe]]:
        every = [(s, p) for s, probes in self.scenarios.items() for p in probes.values()]
        every += list(self.children.items())
        return [(s, p) for s, p in every if not (p.ended or p.task_id is None or p.raised)]


@dataclass
class Rows:
    """What :func:`run_rows` saw: by (row, serializer) what each scenario observed, or
    why its row failed; each row's timeline."""

    outcomes: dict[tuple[str, str], Observed | str]
    timelines: list[str]
    seconds: float
    #: of which copying the session's database for the rows' ledgers
    copying: float


def run_rows(
    plan: list[tuple[Row, tuple[str, ...]]], folder: Path, provider: str, slots: int
) -> Rows:
    """Each row's scenario (the probes ``plan`` names for it), ``slots`` rows at a time."""
    from tests.matrix.config.celery_app import app

    os.environ["MATRIX_PROVIDER"] = provider
    session = connections["default"].settings_dict["NAME"]
    flights = [Flight(row, probes, folder / row.name) for row, probes in plan]
    workers = sum(1 for f in flights if not f.eager)
    transport = {
        "CELERY_BROKER_URL": rows.redis_url(),
        "CELERY_RESULT_BACKEND": rows.redis_url(),
    }
    results: dict[tuple[str, str], Observed | str] = {}
    started = time.monotonic()
    with override_settings(**transport), Ledgers(session, min(slots, workers)) as ledgers:
        copied = time.monotonic()
        free = ledgers.free
        _reset(app)
        waiting = list(flights)
        flying: list[Flight] = []
        try:
            while waiting or flying:
                while waiting and (waiting[0].eager or free):
                    flight = waiting.pop(0)
                    if not flight.eager:
                        flight.ledger = free.pop(0)
                    _guarded(flight, partial(_begin, app, flight, provider))
                    flying.append(flight)
                if waiting and not flying:  # every ledger lost to a landing that failed
                    for flight in waiting:
                        _fail(flight, "no ledger database left to run it on")
                    flying, waiting = waiting, []
                spawning = any(f.stage == "queued" and not f.eager for f in flying)
                for flight in flying:
                    if flight.eager and spawning:
                        continue  # it runs inline: once the workers start, while they do
                    _guarded(flight, partial(_step, app, flight, provider))
                for flight in [f for f in flying if f.stage in ("done", "failed")]:
                    flying.remove(flight)
                    try:
                        _land(flight)
                        if flight.ledger is not None:
                            if any(not f.eager for f in waiting):
                                flight.ledger.empty()
                                free.append(flight.ledger)
                            else:
                                ledgers.retire(flight.ledger)
                    except Exception as error:  # noqa: BLE001 - its outcome stands; its ledger is lost
                        flight.instants[f"landing failed ({error!r})"] = time.monotonic()
                    for serializer in flight.row.serializers:
                        key = (flight.row.name, serializer)
                        results[key] = flight.observed.get(serializer) or (
                            flight.failure or "no outcome"
                        )
                time.sleep(POLL)
        finally:
            for flight in flying:
                _land(flight)
            _reset(app)
    timelines = [
        f"{f.row.name}: from {f.instants.get('queued', started) - started:.1f}: {f.timeline()}"
        + (" (failed)" if f.failure else "")
        for f in flights
    ]
    return Rows(results, timelines, time.monotonic() - started, copied - started)


@dataclass
class Ledger:
    """A ledger database for one row at a time (a slot's), and the alias this process
    reads it through."""

    database: str
    alias: str

    def empty(self) -> None:
        """Empty the library's tables for the next row (the last row's worker is gone)."""
        from django.apps import apps

        tables = [m._meta.db_table for m in apps.get_app_config("celery_deadlines").get_models()]
        with connections[self.alias].cursor() as cursor:
            # any backend of the killed worker not gone yet, which could hold a lock
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            cursor.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")


class Ledgers:
    """``count`` copies of the session's test database (PostgreSQL copies a template
    while nobody is connected to it), each read through an alias of its own: ``free``
    the ones no row runs on. A worker's reconciler acts on its whole ledger: two rows
    never share one at once. Each is dropped once no row needs it, in a thread of its
    own (``DROP DATABASE`` waits for a checkpoint of the whole server: seconds, on a
    busy one); leaving waits for every drop."""

    def __init__(self, session: str, count: int) -> None:
        self.session = session
        self.settings = connections["default"].settings_dict
        self.free = [Ledger(f"{session}_{slot}", f"matrix_{slot}") for slot in range(count)]
        self._all = list(self.free)
        self._drops: list[threading.Thread] = []

    def _server(self) -> Any:
        import psycopg

        return psycopg.connect(
            host=self.settings["HOST"],
            port=self.settings["PORT"] or 5432,
            user=self.settings["USER"],
            dbname="postgres",
            autocommit=True,
        )

    def __enter__(self) -> Ledgers:
        connections.close_all()
        with self._server() as server:
            for ledger in self._all:
                server.execute(f'DROP DATABASE IF EXISTS "{ledger.database}"')  # a crashed run's
                server.execute(f'CREATE DATABASE "{ledger.database}" TEMPLATE "{self.session}"')
                connections.settings[ledger.alias] = {
                    **self.settings,
                    "NAME": ledger.database,
                    "ATOMIC_REQUESTS": False,
                    "CONN_MAX_AGE": None,
                    "OPTIONS": {},
                }
        return self

    def retire(self, ledger: Ledger) -> None:
        """Drop ``ledger``'s database (its row's worker is gone), in a thread."""
        self._all.remove(ledger)
        if ledger.alias in connections.settings:
            connections[ledger.alias].close()
            del connections.settings[ledger.alias]
            with suppress(AttributeError):
                delattr(connections._connections, ledger.alias)  # type: ignore[attr-defined]
        drop = threading.Thread(target=self._drop, args=(ledger.database,), daemon=True)
        drop.start()
        self._drops.append(drop)

    def _drop(self, database: str) -> None:
        with self._server() as server:
            # the workers are gone; their backends, if any are left, too
            server.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            )
            server.execute(f'DROP DATABASE IF EXISTS "{database}"')

    def __exit__(self, *exc: object) -> None:
        for ledger in list(self._all):
            self.retire(ledger)
        for drop in self._drops:
            drop.join()


def _guarded(flight: Flight, act: Callable[[], None]) -> None:
    """Act on a flight; an error fails its row (with what its callers and the ledger
    saw and its worker's log), not the others."""
    if flight.stage in ("done", "failed"):
        return
    try:
        act()
    except Exception as error:  # noqa: BLE001 - any error of a row is its failure
        _fail(flight, f"{type(error).__name__}: {error}")


def _fail(flight: Flight, why: str) -> None:
    told = []
    for serializer, probes in flight.scenarios.items():
        child = flight.children.get(serializer)
        for probe in [*probes.values(), *([child] if child is not None else [])]:
            with suppress(Exception):
                _look(flight, probe)
            told.append(f"  [{serializer}] {_told(probe)}")
    log = flight.worker.log() if flight.worker is not None else "(no worker)"
    flight.failure = (
        f"row {flight.row.name}: {why}\n"
        f"what each probe's caller and the ledger saw:\n" + "\n".join(told) + "\n"
        f"the worker's log ({flight.folder / 'worker.log'}):\n{cut(log)}"
    )
    flight.enter("failed")


def cut(log: str, head: int = 60, tail: int = 300) -> str:
    lines = log.splitlines()
    if len(lines) <= head + tail:
        return log
    return "\n".join([*lines[:head], f"... ({len(lines) - head - tail} lines) ...", *lines[-tail:]])


@contextmanager
def _publishing(app: Any, flight: Flight, serializer: str) -> Iterator[dict[str, str]]:
    """This process as the row's project, on the row's ledger database."""
    with (
        database_settings(flight.row, flight.database),
        configured(app, flight.row, flight.queue, serializer) as env,
    ):
        yield env


def _begin(app: Any, flight: Flight, provider: str) -> None:
    """Publish the row's refusal probes: they wait in the queue, which no worker
    consumes yet, past their deadline (the eager row: their deadline passed before the
    call)."""
    from tests.matrix.orders import tasks

    flight.folder.mkdir(parents=True, exist_ok=True)
    flight.queue = isolation.queue_name(f"matrix-{flight.row.name}-{uuid.uuid4().hex[:8]}")
    for serializer in flight.row.serializers:
        tag = f"{flight.row.name}-{serializer}-{uuid.uuid4().hex[:6]}"
        flight.scenarios[serializer] = {n: Probe(n, f"{tag}-{n}") for n in flight.probes}
    flight.enter("queued")
    for serializer, probes in flight.scenarios.items():
        refusal = probes.get("refusal")
        with _publishing(app, flight, serializer) as env:
            flight.env = env
            if refusal is None:
                continue
            if flight.eager:
                os.environ["MATRIX_NOTES"] = str(flight.notes)
                _publish(refusal, partial(_past_deadline, tasks.charge, refusal.key))
            else:
                _publish(refusal, partial(_apply, tasks.charge, (refusal.key,), REFUSAL_BUDGET))
                if flight.row.broker == "redis" and refusal.task_id is not None:
                    refusal.content_type = _queued_content_type(
                        env["CELERY_BROKER_URL"], flight.queue, refusal.task_id
                    )
                # the delay under test: the deadline passes while the message waits
                flight.spawn_at = time.monotonic() + REFUSAL_BUDGET


def _step(app: Any, flight: Flight, provider: str) -> None:
    now = time.monotonic()
    if flight.stage == "queued" and flight.eager:
        _run_eager(app, flight)
    elif flight.stage == "queued" and now >= flight.spawn_at:
        flight.worker = _worker(flight, provider).spawn()
        flight.started_at = now
        flight.enter("starting")
    elif flight.stage == "starting":
        assert flight.worker is not None
        assert flight.worker.process is not None
        if " ready." in flight.worker.log():
            flight.enter("running")
            _publish_the_rest(app, flight)
        elif flight.worker.process.poll() is not None:
            raise RuntimeError("the worker exited before it was ready")
        elif now > flight.started_at + START:
            raise TimeoutError(f"the worker was not ready within {START} s")
    elif flight.stage == "running":
        _wait(app, flight, now)


def _run_eager(app: Any, flight: Flight) -> None:
    """The eager row's probes, run in this process (each call returns its outcome)."""
    os.environ["MATRIX_NOTES"] = str(flight.notes)
    for serializer, probes in flight.scenarios.items():
        with _publishing(app, flight, serializer):
            _publish_all(probes)
            for probe in probes.values():
                probe.ended = True
            child = _child(app, probes.get("order"), eager=True)
            if child is not None:
                child.ended = True
                flight.children[serializer] = child
            _observe(app, flight, serializer)
    flight.enter("done")


def _publish_the_rest(app: Any, flight: Flight) -> None:
    ready = time.monotonic()
    for serializer, probes in flight.scenarios.items():
        refusal = probes.get("refusal")
        if refusal is not None:  # its outcome comes once the worker consumes it
            refusal.due = ready + LATE
        with _publishing(app, flight, serializer):
            _publish_all(probes)


def _publish_all(probes: dict[str, Probe]) -> None:
    from tests.matrix.orders import tasks

    order = probes.get("order")
    if order is not None:
        _publish(order, lambda _: _through_the_view(order.key))
    published = {
        "retry-refused": (tasks.retry_late, (), RETRY_BUDGET),
        "max-retries": (tasks.retry_often, (), MAX_RETRIES_BUDGET),
        "own-limit": (tasks.dawdle, (OWN_LIMIT_WORK,), OWN_LIMIT_BUDGET),
        "overrun": (tasks.overrun, (OVERRUN_PAST,), OVERRUN_BUDGET),
    }
    for name, (task, args, budget) in published.items():
        probe = probes.get(name)
        if probe is not None:
            _publish(probe, partial(_apply, task, (probe.key, *args), budget))


def _wait(app: Any, flight: Flight, now: float) -> None:
    """Look once at every probe not ended yet; gather each scenario whose probes have
    all ended; fail the row when a probe is past its ceiling."""
    for serializer, probe in flight.waiting():
        if _ended(app, flight, probe):
            probe.ended = True
            if probe.name == "order":
                child = _child(app, probe)
                if child is not None:
                    child.due = probe.due
                    flight.children[serializer] = child
        elif now > probe.due:
            raise TimeoutError(
                f"[{serializer}] {probe.name}: no outcome within its deadline and {LATE} s"
            )
    for serializer, probes in flight.scenarios.items():
        if serializer in flight.observed or any(s == serializer for s, _ in flight.waiting()):
            continue
        if not _settled(flight, probes.get("overrun")):
            continue
        with _publishing(app, flight, serializer):
            _observe(app, flight, serializer)
    if len(flight.observed) == len(flight.scenarios):
        flight.enter("done")


def _settled(flight: Flight, overrun: Probe | None) -> bool:
    """Whether the overrun's body has said all it will: its last note, or the instant it
    would have written it had it worked on past its deadline, and its last step."""
    from celery_deadlines.models import Run

    if overrun is None or overrun.task_id is None:
        return True
    if f'"end", "key": "{overrun.key}"' in _text(flight.notes):
        return True
    run = Run.objects.using(flight.alias).get(task_id=overrun.task_id)
    assert run.deadline is not None
    return time.time() > run.deadline.timestamp() + OVERRUN_PAST + LAST_STEP


def _land(flight: Flight) -> None:
    """Stop the row's worker (its shutdown is not under test) and drop the messages it
    held unacknowledged."""
    if flight.worker is not None:
        flight.worker.kill()
        if flight.row.broker == "redis" and flight.env:
            _forget_unacked(flight.env["CELERY_BROKER_URL"], flight.queue)


def _queued_content_type(broker_url: str, queue: str, task_id: str) -> str | None:
    """The content type of the message of ``task_id`` waiting in a Redis ``queue``: how
    its publisher encoded it."""
    import redis as redis_py

    with redis_py.Redis.from_url(broker_url) as client:
        for raw in client.lrange(queue, 0, -1):
            message = json.loads(raw)
            if message["headers"].get("id") == task_id:
                return str(message["content-type"])
    return None


def _forget_unacked(broker_url: str, queue: str) -> None:
    """Drop the killed worker's unacknowledged messages (an acks_late row's), so that no
    later worker on this Redis database restores them into a queue nobody consumes."""
    import redis as redis_py

    with redis_py.Redis.from_url(broker_url) as client:
        tags = [
            tag for tag, value in client.hgetall("unacked").items() if json.loads(value)[2] == queue
        ]
        if tags:
            client.hdel("unacked", *tags)
            client.zrem("unacked_index", *tags)


def _apply(task: Any, args: tuple[Any, ...], budget: float, task_id: str) -> Any:
    return task.apply_async(args, budget=budget, task_id=task_id)


def _past_deadline(task: Any, key: str, task_id: str) -> Any:
    """An eager call whose deadline passed before it is made (a deadline given, past)."""
    return task.apply_async(
        (key,), deadline=datetime.now(UTC) - timedelta(seconds=1), task_id=task_id
    )


def _worker(flight: Flight, provider: str) -> WorkerProcess:
    row, env = flight.row, flight.env
    transport = Transport(row.broker, env["CELERY_BROKER_URL"], env["CELERY_RESULT_BACKEND"])
    return WorkerProcess(
        transport,
        flight.queue,
        flight.folder / "worker.log",
        pool=row.pool,
        concurrency=row.concurrency,
        app_module="tests.matrix.config.celery_app",
        node=flight.queue,
        extra_env={
            **env,
            "MATRIX_NOTES": str(flight.notes),
            "MATRIX_PROVIDER": provider,
            # Celery refuses to run as root while it accepts pickle (CI runs as root)
            **({"C_FORCE_ROOT": "1"} if "pickle" in row.serializers else {}),
        },
        extra_args=row.worker_args,
    )


def _publish(probe: Probe, publish: Callable[[str], Any]) -> None:
    """Publish (or, eager, run) one probe, under the task id it is given (so that its
    run can be read even when the call raises); an error raised here is what its caller
    saw."""
    probe.due = time.monotonic() + WITHIN[probe.name] + LATE
    probe.task_id = str(uuid.uuid4())
    try:
        result = publish(probe.task_id)
    except Exception as error:  # noqa: BLE001 - a witness: the caller's error, whatever it is
        probe.raised = type(error).__name__
        probe.error_text = str(error)
        return
    probe.task_id = str(result.id)
    if isinstance(result, EagerResult):
        probe.state = result.state
        probe.value = result.result if result.successful() else None
    elif isinstance(result, _Published) and result.state is not None:
        probe.state, probe.value = result.state, result.value


@dataclass
class _Published:
    """What the view answered: the task id, and an eager run's state and value."""

    id: str
    state: str | None = None
    value: Any = None


def _through_the_view(key: str) -> Any:
    """The order, placed through the project's view (a request, ``ATOMIC_REQUESTS``)."""
    response = Client(raise_request_exception=True).post(f"/orders/{key}/")
    if response.status_code != 200:
        raise RuntimeError(f"the view answered {response.status_code}")
    answer = response.json()
    return _Published(answer["task_id"], answer.get("state"), answer.get("value"))


def _ended(app: Any, flight: Flight, probe: Probe) -> bool:
    """Whether the probe's caller has its outcome and its run has ended in the ledger."""
    from celery_deadlines.models import Run

    if probe.task_id is None:
        return True
    meta = app.backend.get_task_meta(probe.task_id, cache=False)
    if meta.get("status") not in ("SUCCESS", "FAILURE"):
        return False
    run = Run.objects.using(flight.alias).filter(task_id=probe.task_id).first()
    return run is None or run.is_terminal


def _look(flight: Flight, probe: Probe) -> None:
    """What the probe's caller and the ledger show now (for a failure's message)."""
    from celery_deadlines.models import Run, RunEvent
    from tests.matrix.config.celery_app import app

    if probe.task_id is None:
        return
    if probe.state is None and probe.raised is None and not flight.eager:
        probe.state = app.backend.get_task_meta(probe.task_id, cache=False).get("status")
    run = Run.objects.using(flight.alias).filter(task_id=probe.task_id).first()
    if run is not None:
        probe.run = {"status": run.status, "reason": run.reason, "attempt": run.attempt}
        probe.events = [
            dict(event)
            for event in RunEvent.objects.using(flight.alias)
            .filter(run=run)
            .order_by("id")
            .values("kind", "outcome", "status")
        ]
    probe.notes = [n for n in _notes(flight.notes) if n["key"] == probe.key]


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _notes(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in _text(path).splitlines() if line.strip()]


def _child(app: Any, order: Probe | None, *, eager: bool = False) -> Probe | None:
    """The order's child, named by the order's return value (eager: as the view said)."""
    if order is None or order.task_id is None or order.raised is not None:
        return None
    if order.value is None and not eager:
        result = app.AsyncResult(order.task_id)
        value = result.result if result.state == "SUCCESS" else None
    else:
        value = order.value
    if not isinstance(value, dict) or "child" not in value:
        return None
    return Probe("child", order.key, task_id=value["child"])


def _explain(order: Probe | None) -> str:
    if order is None or order.task_id is None:
        return ""
    out = io.StringIO()
    try:
        call_command("deadlines", "explain", order.task_id, stdout=out, stderr=io.StringIO())
    except Exception as error:  # noqa: BLE001 - a witness: what the operator would read
        return f"explain failed: {type(error).__name__}: {error}"
    return out.getvalue()


def provider_log() -> Path:
    return Path(os.environ["MATRIX_PROVIDER_LOG"])


def _observe(app: Any, flight: Flight, serializer: str) -> None:
    """Gather one scenario's witnesses (on the row's ledger database: ``_publishing``)."""
    probes = flight.scenarios[serializer]
    child = flight.children.get(serializer)
    observed = Observed(
        flight.row,
        serializer,
        probes,
        child,
        _explain(probes.get("order")),
        flight.worker.log() if flight.worker is not None else "",
    )
    _gather(app, observed, flight.notes, provider_log(), eager=flight.eager)
    observed.workload = _workload(flight)
    flight.observed[serializer] = observed


def _workload(flight: Flight) -> dict[bytes, bytes]:
    """The reports of what the row's worker holds on its queue, while it runs: in the
    Redis broker, or beside RabbitMQ in the Redis result backend (both
    ``rows.redis_url()``); none for the eager row, which has no worker."""
    import redis as redis_py

    from celery_deadlines.core import workload

    if flight.eager or flight.worker is None:
        return {}
    with redis_py.Redis.from_url(rows.redis_url()) as client:
        reports: dict[bytes, bytes] = client.hgetall(workload.key(flight.queue))
    return reports


def _gather(app: Any, observed: Observed, notes: Path, calls: Path, *, eager: bool) -> None:
    from celery_deadlines.models import Effect, Run, RunEvent

    all_notes = _notes(notes)
    all_calls = _notes(calls)
    probes = list(observed.probes.values())
    if observed.child is not None:
        probes.append(observed.child)
    for probe in probes:
        probe.notes = [n for n in all_notes if n["key"] == probe.key]
        probe.calls = [c for c in all_calls if c["key"].startswith(probe.key)]
        if probe.task_id is None:
            continue
        if probe.state is None and probe.raised is None and not eager:  # the caller's result
            meta = app.backend.get_task_meta(probe.task_id, cache=False)
            probe.state = meta.get("status")
            result = meta.get("result")
            if isinstance(result, BaseException):
                probe.error = type(result).__name__
                probe.error_text = str(result)
            else:
                probe.value = result
        run = Run.objects.filter(task_id=probe.task_id).first()
        if run is None:
            continue
        probe.run = {
            "status": run.status,
            "reason": run.reason,
            "detail": run.detail,
            "deadline": run.deadline,
            "attempt": run.attempt,
            "owner": run.owner,
            "updated_at": run.updated_at,
        }
        probe.events = [
            dict(event)
            for event in RunEvent.objects.filter(run=run)
            .order_by("id")
            .values("kind", "outcome", "status", "reason", "at", "owner", "lease_token")
        ]
        probe.effects = [
            dict(effect)
            for effect in Effect.objects.filter(run=run).values(
                "key", "state", "dispatches", "lease_token"
            )
        ]
