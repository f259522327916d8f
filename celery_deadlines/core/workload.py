"""A worker's report of the work it holds, per queue, for the enqueue gate's rule for the
queue ahead (:mod:`celery_deadlines.rules.backlog`).

A worker prefetches: the messages it took off a queue and has not started wait in it,
where the broker does not see them, and a message the claim gate refuses was taken off
the queue but served nothing. So each ``celery worker`` whose app has DeadlineTasks,
on Redis (or on RabbitMQ with a Redis result backend: the reports are kept there),
with ``deadlines_backlog_refusal`` on, reports every
:data:`EVERY` seconds, for each queue it consumes, the messages it holds not started
(Celery's reserved requests less its active ones), and how many it received from the
queue and started since it began: one hash per queue (:func:`key`), a field per worker
process (``hostname:pid:random``), the value ``seq held received started``. A
publisher reads the hash with the queue (:mod:`celery_deadlines.core.backlog`), and
judges a report fresh by its ``seq`` growing, on its own clock.

The reports are written by a thread of the worker's main process, on a connection of
its own: a broker that is slow or down delays the reports, never the worker. A worker
removes its field when it stops; the hash expires when no worker of the queue wrote it
for :data:`EXPIRES`, and each worker removes, every :data:`SWEEP_EVERY`, the fields that
did not change since the sweep before (a worker killed without stopping).
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
from typing import Any, Final

import celery.worker.request
from celery.signals import task_received, worker_ready, worker_shutdown
from celery.worker import state

from .. import conf
from ..conf import settings_for
from ..rules.contracts import is_deadline_task

logger = logging.getLogger(__name__)

#: How often (seconds) a worker reports.
EVERY: Final = 0.05
#: How long (milliseconds) a queue's hash outlives its last report.
EXPIRES: Final = 60_000
#: How often (seconds) a worker removes the reports that stopped changing.
SWEEP_EVERY: Final = 10.0
#: The prefix of a queue's hash of reports.
PREFIX: Final = "celery-deadlines.workload."


def key(queue: str) -> str:
    """The hash a queue's workers report in."""
    return PREFIX + queue


def lists_read(channel: Any) -> bool:
    """Whether the publishers read a channel's queues as lists, with the reports beside
    them: Redis, with no keys under a ``global_keyprefix`` (which kombu adds to some
    commands only)."""
    return redis_like(channel) and not getattr(channel, "global_keyprefix", None)


def redis_like(channel: Any) -> bool:
    """Whether a channel (or its class) keeps a queue as Redis's lists do, with its
    priority steps beside it."""
    return (
        getattr(channel, "priority_steps", None) is not None
        and getattr(channel, "_q_for_pri", None) is not None
    )


def reports_in_backend(app: Any, transport: Any) -> bool:
    """Whether a queue's reports are kept in the app's result backend: its broker is
    RabbitMQ (which keeps none) and its result backend Redis. On a Redis broker they
    are kept in the broker, read with the queue."""
    if getattr(transport, "driver_type", None) != "amqp":
        return False
    # looked up, not imported: a Redis backend in use has imported it, and importing it
    # imports redis-py (and, with it, OpenTelemetry where that is installed)
    redis_backends = sys.modules.get("celery.backends.redis")
    return redis_backends is not None and isinstance(app.backend, redis_backends.RedisBackend)


def bindings(queues: Any) -> dict[tuple[Any, Any], str]:
    """The queue a message came from, by the exchange and routing key it names, among
    the kombu ``queues`` a worker consumes: the one bound so, unless two are (then
    neither: its message is counted in no queue)."""
    names: dict[tuple[Any, Any], set[str]] = {}
    for queue in queues:
        binding = (getattr(queue.exchange, "name", None), queue.routing_key)
        names.setdefault(binding, set()).add(queue.name)
    return {binding: name for binding, (name, *more) in names.items() if not more}


class _Counts:
    """What this worker received from each queue and started, since it began: counted
    by the consumer (received) and by the pool's accept callback (started, in a thread
    of the pool when it has threads: under a lock)."""

    def __init__(self, bindings: dict[tuple[Any, Any], str], only: str | None) -> None:
        self.bindings = bindings
        self.only = only
        self.received: dict[str, int] = {}
        self.started: dict[str, int] = {}
        self.lock = threading.Lock()

    def queue_of(self, request: Any) -> str | None:
        if self.only is not None:
            return self.only
        info = getattr(request, "delivery_info", None)
        if not isinstance(info, dict):
            return None
        try:
            return self.bindings.get((info.get("exchange"), info.get("routing_key")))
        except TypeError:  # a binding no queue can have (unhashable)
            return None

    def count(self, counts: dict[str, int], request: Any) -> None:
        queue = self.queue_of(request)
        if queue is not None:
            with self.lock:
                counts[queue] += 1


_counts: _Counts | None = None
_reporter: _Reporter | None = None


def _received(sender: Any = None, request: Any = None, **_: Any) -> None:
    counts = _counts
    if counts is not None:
        counts.count(counts.received, request)


#: Celery's ``Request.on_accepted`` (a body starts, in every pool) calls the function of
#: this name in its module: wrapped while a worker reports (:func:`_start`), to count it.
_task_accepted = celery.worker.request.task_accepted  # type: ignore[attr-defined]


def _accepted(request: Any, *args: Any, **kwargs: Any) -> Any:
    counts = _counts
    if counts is not None:
        counts.count(counts.started, request)
    return _task_accepted(request, *args, **kwargs)


class _Reporter(threading.Thread):
    """Writes this worker's report every :data:`EVERY` seconds, on a connection of its
    own, until :func:`_stop`; then removes it."""

    def __init__(self, app: Any, counts: _Counts, queues: list[str], field: bytes) -> None:
        super().__init__(name="celery-deadlines-workload", daemon=True)
        self.app = app
        self.counts = counts
        self.queues = queues
        self.field = field
        self.stopping = threading.Event()
        self.seq = 0
        self.swept: dict[str, dict[bytes, bytes]] = {}

    def run(self) -> None:
        sweep_at = 0
        with self.app.connection_for_write() as connection:
            while not self.stopping.wait(EVERY):
                try:
                    client = self.client(connection)
                    if client is None:
                        return  # not a broker the publishers read
                    self.report(client)
                    sweep_at += 1
                    if sweep_at * EVERY >= SWEEP_EVERY:
                        sweep_at = 0
                        self.sweep(client)
                # a report is never worth a worker: the publishers judge without it
                except Exception as exc:  # noqa: BLE001
                    logger.debug("workload not reported: %r", exc)
                    connection.collect()
            if not (connection.connected or reports_in_backend(self.app, connection.transport)):
                return
            try:
                client = self.client(connection)
                pipe = client.pipeline(transaction=False)
                for queue in self.queues:
                    pipe.hdel(key(queue), self.field)
                pipe.execute()
            except Exception as exc:  # noqa: BLE001
                logger.debug("workload report not removed: %r", exc)

    def client(self, connection: Any) -> Any:
        """The Redis client the reports are written with: the result backend's, beside
        RabbitMQ; the broker's (one try to connect a report); ``None``: neither."""
        if reports_in_backend(self.app, connection.transport):
            return self.app.backend.client
        connection.ensure_connection(max_retries=1)
        channel = connection.default_channel
        return channel.client if lists_read(channel) else None

    def held(self) -> dict[str, int] | None:
        """The requests held not started, per queue (``None``: the sets changed under
        the snapshot: the next report tries again)."""
        try:
            reserved = list(state.reserved_requests)
            active = set(state.active_requests)
        except RuntimeError:
            return None
        held = dict.fromkeys(self.queues, 0)
        for request in reserved:
            if request not in active:
                queue = self.counts.queue_of(request)
                if queue is not None:
                    held[queue] += 1
        return held

    def report(self, client: Any) -> None:
        held = self.held()
        if held is None:
            return
        self.seq += 1
        counts = self.counts
        pipe = client.pipeline(transaction=False)
        for queue in self.queues:
            value = f"{self.seq} {held[queue]} {counts.received[queue]} {counts.started[queue]}"
            pipe.hset(key(queue), self.field, value)
            pipe.pexpire(key(queue), EXPIRES)
        pipe.execute()

    def sweep(self, client: Any) -> None:
        """Remove the reports that did not change since the last sweep (their workers
        are gone)."""
        pipe = client.pipeline(transaction=False)
        for queue in self.queues:
            pipe.hgetall(key(queue))
        for queue, reports in zip(self.queues, pipe.execute(), strict=True):
            before = self.swept.get(queue, {})
            gone = [f for f, v in reports.items() if f != self.field and before.get(f) == v]
            if gone:
                client.hdel(key(queue), *gone)
            self.swept[queue] = reports


def _start(sender: Any = None, **_: Any) -> None:
    """At ``worker_ready`` (``sender``: the worker's consumer): report, if the worker's app
    has DeadlineTasks and the rule on (the thread itself finds whether its broker is one
    the publishers read)."""
    global _counts, _reporter
    app = getattr(sender, "app", None)
    consumer = getattr(sender, "task_consumer", None)
    if app is None or consumer is None or _reporter is not None:
        return
    if not settings_for(app).get(conf.BACKLOG_REFUSAL):
        return
    if not any(is_deadline_task(task) for task in app.tasks.values()):
        return
    queues = sorted({queue.name for queue in consumer.queues})
    if not queues:
        return
    counts = _Counts(bindings(consumer.queues), queues[0] if len(queues) == 1 else None)
    counts.received.update(dict.fromkeys(queues, 0))
    counts.started.update(dict.fromkeys(queues, 0))
    _counts = counts
    celery.worker.request.task_accepted = _accepted  # type: ignore[attr-defined]
    task_received.connect(_received, dispatch_uid=_RECEIVED, weak=False)
    # a worker's own field, even where two share a name and a pid (containers)
    hostname = getattr(sender, "hostname", None) or "worker"
    field = f"{hostname}:{os.getpid()}:{secrets.token_hex(4)}".encode()
    _reporter = _Reporter(app, counts, queues, field)
    _reporter.start()


def _stop(**_: Any) -> None:
    global _counts, _reporter
    reporter, _reporter, _counts = _reporter, None, None
    task_received.disconnect(_received, dispatch_uid=_RECEIVED)
    if reporter is not None:
        reporter.stopping.set()
        reporter.join(timeout=2.0)


_RECEIVED: Final = "celery_deadlines.workload.received"


def connect() -> None:
    """Report from every worker started from now on (idempotent)."""
    worker_ready.connect(_start, dispatch_uid="celery_deadlines.workload.start", weak=False)
    worker_shutdown.connect(_stop, dispatch_uid="celery_deadlines.workload.stop", weak=False)
