"""One row's scenario on a real worker, and what it observed from the outside.

:func:`run` configures the test process's Celery app as the row's worker is, publishes
the refusal probe, starts the worker (``celery -A tests.matrix.config.celery_app worker``
with the row's settings, pool and arguments), publishes the other probes (the order
through the project's view, under ``ATOMIC_REQUESTS``), waits for every one to end,
and gathers the witnesses: each probe's ``AsyncResult``, its run, events and effects in
the ledger, the provider's calls, the bodies' notes, ``manage.py deadlines explain`` of
the order, and the worker's log. The eager row runs the same probes in this process.
"""

from __future__ import annotations

import io
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import kombu.pools
from django.core.management import call_command
from django.db import connections
from django.test import Client

from tests.support import isolation
from tests.support.processes import WorkerProcess, wait_for

from . import rows
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
#: how long a probe may take to end once it can, on a busy machine
PATIENCE = 30.0


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
    seconds: float


def ledger_database_url() -> str:
    database = connections["default"].settings_dict
    return (
        f"postgres://{database['USER']}@{database['HOST']}:{database['PORT'] or 5432}/"
        f"{database['NAME']}"
    )


def _celery_name(setting: str) -> str:
    return setting.removeprefix("CELERY_").lower()


@contextmanager
def configured(app: Any, row: Row, queue: str, serializer: str) -> Iterator[dict[str, str]]:
    """The test process's app as the row's worker runs (its Celery settings, broker,
    queue and serializer) meanwhile; yields the worker's environment."""
    broker = rows.amqp_url() if row.broker == "rabbitmq" else rows.redis_url()
    changes: dict[str, Any] = {
        "broker_url": broker,
        "result_backend": rows.redis_url(),
        "task_default_queue": queue,
        "task_serializer": serializer,
        "result_serializer": "json",
        "task_always_eager": row.settings_module == "local",
        "task_eager_propagates": row.settings_module == "local",
    }
    for name, value in row.settings.items():
        if name.startswith("CELERY_"):
            changes[_celery_name(name)] = value
    saved = {key: app.conf[key] for key in changes}
    app.conf.update(changes)
    _reset(app)
    try:
        yield {
            "CELERY_BROKER_URL": broker,
            "CELERY_RESULT_BACKEND": rows.redis_url(),
            "MATRIX_QUEUE": queue,
            "MATRIX_SETTINGS": json.dumps(row.settings),
            "DATABASE_URL": ledger_database_url(),
            "DJANGO_SETTINGS_MODULE": f"tests.matrix.config.settings.{row.settings_module}",
        }
    finally:
        app.conf.update(saved)
        _reset(app)


def _reset(app: Any) -> None:
    """Close the app's connections, so that the next publish follows its configuration."""
    backend = app._local.__dict__.pop("backend", None)
    pool = getattr(getattr(backend, "client", None), "connection_pool", None)
    if pool is not None:
        pool.disconnect()
    kombu.pools.reset()
    app._pool = None
    app.__dict__.pop("amqp", None)


@contextmanager
def database_settings(row: Row) -> Iterator[None]:
    """The row's settings of the default alias (its pool, CONN_MAX_AGE) in this process."""
    alias = connections["default"].settings_dict
    changed = {
        name.split("__", 2)[2]: value
        for name, value in row.settings.items()
        if name.startswith("DATABASES__default__")
    }
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


def run(row: Row, serializer: str, folder: Path, provider: str) -> Observed:
    """The row's scenario with ``serializer``, on a worker of its own (in this process
    for the eager row)."""
    from tests.matrix.config.celery_app import app
    from tests.matrix.orders import tasks

    folder.mkdir(parents=True, exist_ok=True)
    notes = folder / "notes.jsonl"
    os.environ["MATRIX_NOTES"] = str(notes)  # the eager row's bodies run here
    os.environ["MATRIX_PROVIDER"] = provider
    queue = isolation.queue_name(f"matrix-{row.name}-{uuid.uuid4().hex[:8]}")
    tag = f"{row.name}-{serializer}-{uuid.uuid4().hex[:6]}"
    probes = {name: Probe(name, f"{tag}-{name}") for name in row.probes}
    started = time.monotonic()
    worker: WorkerProcess | None = None
    with configured(app, row, queue, serializer) as env, database_settings(row):
        eager = row.settings_module == "local"
        refusal = probes.get("refusal")
        if refusal is not None:
            # published before any worker consumes the queue, and left there past its
            # deadline (eager: there is no queue; its deadline passes before the call)
            if eager:
                _publish(refusal, lambda: _sleep_then(tasks.charge, refusal.key))
            else:
                _publish(
                    refusal, lambda: tasks.charge.apply_async((refusal.key,), budget=REFUSAL_BUDGET)
                )
                time.sleep(REFUSAL_BUDGET)  # the delay under test: the deadline passes queued
        if not eager:
            worker = _worker(row, queue, folder, env, notes, provider).start(timeout=60)
        try:
            _publish_the_rest(row, probes, tasks)
            if not eager:
                _wait(app, probes)
            child = _child(app, probes.get("order"))
            if child is not None and not eager:
                _wait(app, {"child": child})
            observed = Observed(
                row,
                serializer,
                probes,
                child,
                _explain(probes.get("order")),
                worker.log() if worker is not None else "",
                time.monotonic() - started,
            )
            _gather(app, observed, notes, provider_log(provider))
        finally:
            if worker is not None:
                worker.kill()  # its shutdown is not under test
                if row.broker == "redis":
                    _forget_unacked(env["CELERY_BROKER_URL"], queue)
    return observed


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


def _sleep_then(task: Any, key: str) -> Any:
    """An eager call whose deadline passed before it is made (a deadline given, past)."""
    from datetime import UTC, timedelta

    return task.apply_async((key,), deadline=datetime.now(UTC) - timedelta(seconds=1))


def _worker(
    row: Row, queue: str, folder: Path, env: dict[str, str], notes: Path, provider: str
) -> WorkerProcess:
    from tests.support.processes import Transport

    transport = Transport(row.broker, env["CELERY_BROKER_URL"], env["CELERY_RESULT_BACKEND"])
    return WorkerProcess(
        transport,
        queue,
        folder / "worker.log",
        pool=row.pool,
        concurrency=row.concurrency,
        app_module="tests.matrix.config.celery_app",
        node=queue,
        extra_env={
            **env,
            "MATRIX_NOTES": str(notes),
            "MATRIX_PROVIDER": provider,
            # Celery refuses to run as root while it accepts pickle (CI runs as root)
            **({"C_FORCE_ROOT": "1"} if "pickle" in row.serializers else {}),
        },
        extra_args=row.worker_args,
    )


def _publish(probe: Probe, publish: Callable[[], Any]) -> None:
    """Publish (or, eager, run) one probe; an error raised here is what its caller saw."""
    try:
        result = publish()
    except Exception as error:  # noqa: BLE001 - a witness: the caller's error, whatever it is
        probe.raised = type(error).__name__
        probe.error_text = str(error)
        return
    probe.task_id = str(result.id)
    if getattr(result, "state", None) is not None and type(result).__name__ == "EagerResult":
        probe.state = result.state
        probe.value = result.result if result.successful() else None


def _publish_the_rest(row: Row, probes: dict[str, Probe], tasks: Any) -> None:
    order = probes.get("order")
    if order is not None:
        _publish(order, lambda: _through_the_view(order.key))
    if "retry-refused" in probes:
        p = probes["retry-refused"]
        _publish(p, lambda: tasks.retry_late.apply_async((p.key,), budget=RETRY_BUDGET))
    if "max-retries" in probes:
        q = probes["max-retries"]
        _publish(q, lambda: tasks.retry_often.apply_async((q.key,), budget=MAX_RETRIES_BUDGET))
    if "own-limit" in probes:
        o = probes["own-limit"]
        _publish(
            o, lambda: tasks.dawdle.apply_async((o.key, OWN_LIMIT_WORK), budget=OWN_LIMIT_BUDGET)
        )
    if "overrun" in probes:
        v = probes["overrun"]
        _publish(v, lambda: tasks.overrun.apply_async((v.key, OVERRUN_PAST), budget=OVERRUN_BUDGET))


class _Published:
    def __init__(self, task_id: str) -> None:
        self.id = task_id


def _through_the_view(key: str) -> Any:
    """The order, placed through the project's view (a request, ``ATOMIC_REQUESTS``)."""
    response = Client(raise_request_exception=True).post(f"/orders/{key}/")
    if response.status_code != 200:
        raise RuntimeError(f"the view answered {response.status_code}")
    return _Published(response.json()["task_id"])


def _ended(app: Any, probe: Probe) -> bool:
    """Whether the probe's caller has its outcome and its run has ended in the ledger."""
    from celery_deadlines.models import Run

    if probe.task_id is None:
        return True
    meta = app.backend.get_task_meta(probe.task_id, cache=False)
    if meta.get("status") not in ("SUCCESS", "FAILURE"):
        return False
    run = Run.objects.filter(task_id=probe.task_id).first()
    return run is None or run.is_terminal


def _wait(app: Any, probes: dict[str, Probe]) -> None:
    for probe in probes.values():
        wait_for(lambda p=probe: _ended(app, p), PATIENCE, interval=0.1)
    overrun = probes.get("overrun")
    if overrun is not None and overrun.task_id is not None:
        # a body nothing stops goes on past its deadline: wait for its last note, or as
        # long as it would work on (then it was stopped)
        from celery_deadlines.models import Run

        run = Run.objects.get(task_id=overrun.task_id)
        assert run.deadline is not None
        until = run.deadline.timestamp() + OVERRUN_PAST + 1.0
        notes = Path(os.environ["MATRIX_NOTES"])
        while time.time() < until and f'"end", "key": "{overrun.key}"' not in _text(notes):
            time.sleep(0.1)


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _child(app: Any, order: Probe | None) -> Probe | None:
    if order is None or (not isinstance(order.value, dict) and order.task_id is None):
        return None
    if order.task_id is None:
        return None
    if order.value is None:
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


def provider_log(url: str) -> Path:
    return Path(os.environ["MATRIX_PROVIDER_LOG"])


def _gather(app: Any, observed: Observed, notes: Path, calls: Path) -> None:
    from celery_deadlines.models import Effect, Run, RunEvent

    all_notes = [json.loads(line) for line in _text(notes).splitlines() if line.strip()]
    all_calls = [json.loads(line) for line in _text(calls).splitlines() if line.strip()]
    probes = list(observed.probes.values())
    if observed.child is not None:
        probes.append(observed.child)
    for probe in probes:
        probe.notes = [n for n in all_notes if n["key"] == probe.key]
        probe.calls = [c for c in all_calls if c["key"].startswith(probe.key)]
        if probe.task_id is None:
            continue
        if probe.state is None:  # not eager: the caller's result
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
