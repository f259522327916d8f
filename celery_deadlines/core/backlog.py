"""The queue a publish joins, as the publishing process sees it on the broker: the
samples :mod:`celery_deadlines.rules.backlog` judges a publish by.

Each process watches each queue it publishes a deadline to. At most every
:data:`INTERVAL` a publish reads the queue (one round trip through Celery's own
producer pool, one ``MULTI`` on Redis): its length, its newest
message, and where the newest message of the previous reading now is (``LPOS``).
Kombu pushes on the left and workers pop on the right, so that position is how many
were pushed since, and with the two lengths how many were taken off: every
publisher's and every worker's, counted by the broker, not inferred from this
process's own publishes. The same ``MULTI`` reads the queue's workers' reports
(:mod:`celery_deadlines.core.workload`): what they hold not started, received and
started. The publishes between two readings are judged by the last.

On RabbitMQ (its result backend Redis, where the workers report then), a passive
declare on a channel of its own gives the queue's ready messages and its consumers,
and the reports are read from the result backend: the queue is judged when every
consumer reports. Only those two are read (a Redis broker without ``LPOS``, with a
``global_keyprefix``, or a queue whose priority steps hold messages; RabbitMQ with
another result backend; any other broker: not judged), and only a publish that
starts now (no ``eta`` or ``countdown``), is sent to a broker (no
``task_always_eager``: the broker is never read then), is no member of a group or
chord (refusing one member would leave the others published), to a queue named by
the call, by the task, or by the app's ``task_routes`` when they are mappings (a
router function may read the arguments: its queue is not worked out here).
Everything else, a failed reading included, is admitted: the claim gate judges it
as before. A reading never connects to the broker: a producer whose connection is
not made (or was lost) is not read from until a publish, under Celery's retry
policy, connects it.
"""

from __future__ import annotations

import logging
import threading
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any, Final

from celery.app.routes import MapRoute

from .. import clock, conf
from ..conf import settings_for
from ..rules import backlog, wire
from ..rules.gates import Decision
from . import options, workload

logger = logging.getLogger(__name__)

#: How often (seconds) a process reads a queue it publishes to, at most.
INTERVAL: Final = 0.05
#: How long (seconds) a queue this module does not read is left before it is asked
#: again (an app may be configured again: its broker, its transport options).
UNREAD: Final = 5.0
#: The samples kept per queue (more than WINDOW / INTERVAL).
KEPT: Final = 40
#: The app attributes each app's watches, and its tasks' own queues, are kept in.
_WATCHES: Final = "_celery_deadlines_backlog"
_DEFAULTS: Final = "_celery_deadlines_backlog_queues"
#: The attribute a RabbitMQ connection keeps its channel for readings in.
_DECLARING: Final = "_celery_deadlines_backlog_channel"


class _Watch:
    """One queue as this process sees it: the samples, the newest message last seen."""

    __slots__ = (
        "best",
        "judged",
        "lock",
        "marker",
        "queue",
        "read_at",
        "refused",
        "samples",
        "seen",
        "tried",
    )

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.samples: list[backlog.Sample] = []
        self.read_at = -INTERVAL
        self.marker: bytes | None = None
        self.tried = 0
        self.refused = 0
        self.lock = threading.Lock()
        #: the backlog the last reading showed (None: nothing to judge by)
        self.judged: backlog.Backlog | None = None
        #: the best rate the queue was measured served at, lately (rules/backlog.py)
        self.best: backlog.Best | None = None
        #: the workers' reports as the last reading saw them (core/workload.py)
        self.seen: dict[bytes, backlog.Seen] = {}

    def read(self, app: Any, now: float) -> None:
        """Read the queue (one round trip on Redis; on RabbitMQ, one to the broker and
        one to the result backend), add its sample, judge the samples."""
        self.read_at = now
        consumers = None
        try:
            with app.producer_or_acquire(None) as producer:
                connection = producer.connection
                rabbitmq = workload.reports_in_backend(app, connection.transport)
                if not connection.connected:
                    if not (rabbitmq or workload.redis_like(connection.transport.Channel)):
                        raise _NotJudged  # known without connecting
                    # connecting is the publish's to do, under its own retry policy: a
                    # reading that connected would add its retries to a broker that is down
                    raise _NotConnected
                if rabbitmq:
                    depth, consumers = _declared(connection, self.queue)
                    taken = pushed = None
                    raw = app.backend.client.hgetall(workload.key(self.queue))
                else:
                    depth, taken, pushed, raw = self._listed(producer.channel)
        # a reading never fails a publish: what it cannot read, it does not judge by
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, _NotJudged):
                self.read_at = now + UNREAD  # not a queue this module reads: asked again later
            else:
                logger.debug("queue %s not read: %r", self.queue, exc)
            self.samples.clear()
            self.marker = None
            self.judged = None
            self.seen = {}
            return
        reports, self.seen = backlog.read_reports(raw, self.seen, now)
        if reports is not None and consumers is not None and reports.workers < consumers:
            reports = None  # a consumer that does not report: its share is not known
        sample = backlog.Sample(now, depth, taken, pushed, self.tried, self.refused)
        if reports is not None:
            sample = sample._replace(
                held=reports.held, received=reports.received, started=reports.started
            )
        self.samples.append(sample)
        del self.samples[:-KEPT]
        measured = backlog.estimate(self.samples, now)
        self.best = backlog.remember(self.best, measured, now)
        self.judged = backlog.at_best(measured, self.best)

    def _listed(self, channel: Any) -> tuple[int, int | None, int | None, Any]:
        """A Redis queue's length, and what was taken off it and pushed onto it since
        the last reading (``None``: not known), and its workers' reports: one
        ``MULTI``."""
        others = _other_steps(channel, self.queue)
        if others is None:
            raise _NotJudged
        pipe = channel.client.pipeline(transaction=True)
        if others:
            pipe.exists(*others)
        else:
            pipe.echo(b"0")
        pipe.llen(self.queue)
        pipe.lindex(self.queue, 0)
        pipe.hgetall(workload.key(self.queue))
        if self.marker is not None:
            pipe.lpos(self.queue, self.marker)
        replies = pipe.execute()
        if int(replies[0]):
            raise _NotJudged  # a message with a priority waits where it is not seen
        depth, newest = int(replies[1]), replies[2]
        taken = pushed = None
        if self.marker is not None and replies[4] is not None and self.samples:
            pushed = int(replies[4])
            taken = self.samples[-1].depth - depth + pushed
        self.marker = newest if isinstance(newest, bytes) else None
        return depth, taken, pushed, replies[3]


def _declared(connection: Any, queue: str) -> tuple[int, int]:
    """A RabbitMQ queue's ready messages and consumers, by a passive declare on a channel
    of its own (a queue that does not exist closes the channel it is asked on), kept
    with the connection for its next reading (a channel opened for each reading, 20 a
    second a queue and a process, is the churn RabbitMQ warns of)."""
    channel = getattr(connection, _DECLARING, None)
    if channel is None or not getattr(channel, "is_open", False):
        channel = connection.channel()
        setattr(connection, _DECLARING, channel)
    try:
        declared = channel.queue_declare(queue=queue, passive=True)
    except Exception:
        setattr(connection, _DECLARING, None)
        with suppress(Exception):
            channel.close()
        raise
    return int(declared.message_count), int(declared.consumer_count)


class _NotJudged(Exception):
    """A queue this module does not read."""


class _NotConnected(Exception):
    """The producer's connection is not made yet, or was lost."""


def _other_steps(channel: Any, queue: str) -> list[str] | None:
    """The lists a Redis channel keeps ``queue``'s messages with a priority in (a
    message with one waits there, unseen by a reading of the queue's own list);
    ``None``: not a channel this module reads."""
    if not workload.lists_read(channel):
        return None
    return [channel._q_for_pri(queue, step) for step in channel.priority_steps if step]


def _queue_of(task: Any, call: dict[str, Any], now: float) -> str | None:
    """The queue a publish goes to, when the call names it, or the task, or the app's
    routes by the task's name alone, or none of them (the default queue); ``None``:
    not judged (a router that may read the arguments). A task's own (the call names
    none) is worked out from the app's configuration at most every :data:`INTERVAL`,
    as the queue is read: reading Celery's configuration costs a publish more than the
    rest of this."""
    queue = call.get("queue")
    if queue is None:
        if call.get("routing_key") or call.get("exchange"):
            return None
        defaults: dict[str, tuple[float, str | None]] | None = getattr(task.app, _DEFAULTS, None)
        if defaults is None:
            defaults = {}
            setattr(task.app, _DEFAULTS, defaults)
        kept = defaults.get(task.name)
        if kept is not None and now - kept[0] < INTERVAL:
            return kept[1]
        config = task.app.conf
        # Celery's order: the task's own queue, then the routes, then the default
        queue = getattr(task, "queue", None)
        if queue is None:
            queue = _routed(task) if config.task_routes else config.task_default_queue
        name = queue if queue is None or type(queue) is str else getattr(queue, "name", None)
        defaults[task.name] = (now, name)
        return name
    return queue if type(queue) is str else getattr(queue, "name", None)


def _routed(task: Any) -> Any:
    """The queue the app's ``task_routes`` send ``task`` to, when they are mappings
    (Celery's ``MapRoute``: by the task's name alone); ``None`` when a router may read
    the arguments, or the route cannot be worked out (Celery will say so at the send)."""
    amqp = task.app.amqp
    if not all(isinstance(route, MapRoute) for route in amqp.routes):
        return None
    try:
        return amqp.router.route({}, task.name).get("queue")
    except Exception:  # noqa: BLE001  (a route to a queue missing from task_queues)
        return None


def admit(task: Any, call: dict[str, Any]) -> Decision | None:
    """The enqueue gate's refusal of a stamped publish (``call``: its options, its
    deadline header written) that the queue ahead of it cannot reach in time, by
    :func:`celery_deadlines.rules.backlog.admit`; ``None``: admitted, or not judged."""
    if call.get("eta") is not None or call.get("countdown") is not None:
        return None  # it waits for its start elsewhere: the claim gate judges it then
    if call.get("group_id") or call.get("chord"):
        return None  # a member of a group or chord: refusing it would publish the rest
    now = clock.monotonic()
    queue = _queue_of(task, call, now)
    if queue is None:
        return None
    app = task.app
    watches: dict[str, _Watch] | None = getattr(app, _WATCHES, None)
    if watches is None:
        watches = {}
        setattr(app, _WATCHES, watches)
    watch = watches.get(queue)
    if watch is None:
        watch = watches.setdefault(queue, _Watch(queue))
    watch.tried += 1
    due = now - watch.read_at >= INTERVAL
    if not due and watch.judged is None:
        return None  # the last reading showed nothing to judge by: most publishes end here
    if app.conf.task_always_eager:
        return None  # it runs here, now: no queue is ahead of it, and none is read
    settings = settings_for(app)
    if not settings.get(conf.BACKLOG_REFUSAL):
        watch.read_at, watch.judged = now, None  # asked again at the next reading's time
        return None
    if due and watch.lock.acquire(blocking=False):
        try:
            watch.read(app, now)
        finally:
            watch.lock.release()
    judged = watch.judged
    if judged is None:
        return None
    raw = (call.get("headers") or {}).get(wire.DEADLINE_HEADER)
    if type(raw) is not float:
        return None
    reserve = options.times(task, settings).duration("reserve")
    decision = backlog.admit(
        judged, datetime.fromtimestamp(raw, UTC), clock.get_clock().now(), reserve
    )
    if decision is not None:
        watch.refused += 1
    return decision
