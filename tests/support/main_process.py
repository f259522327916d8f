"""A worker's main process without a broker or a pool: Celery's own strategy for a task
(``task.start_strategy``), as the consumer runs it for each message, handing the
requests it makes to a pool that only records what it was given.

The consumer and the pool are what Celery's strategy and request touch of them (as in
bench/worker_instructions.py): the request is built, judged (``revoked()``: the claim
gate), its time limits read and handed to the pool, which accepts the job and reports
its success at once; a message with an ETA is handed on as its timer fires, at once.
What happened to each message is kept: acknowledged, rejected, handed to the pool.
"""

from __future__ import annotations

import time
from contextlib import suppress
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from celery.exceptions import TaskRevokedError
from celery.worker import state as worker_state
from kombu import Message
from kombu.utils.json import dumps


@dataclass
class Handed:
    """A job handed to the pool: its task id and the time limits given with it."""

    task_id: Any
    soft: Any
    hard: Any


@dataclass
class Pool:
    """Records the jobs it is given; accepts each and reports its success at once."""

    handed: list[Handed] = field(default_factory=list)

    def apply_async(
        self,
        target: Any,
        args: Any,
        accept_callback: Any,
        timeout_callback: Any,
        callback: Any,
        error_callback: Any,
        soft_timeout: Any,
        timeout: Any,
        correlation_id: Any,
    ) -> None:
        self.handed.append(Handed(correlation_id, soft_timeout, timeout))
        accept_callback(4321, time.monotonic())
        callback((False, None, 0.001))


@dataclass
class Delivery:
    """What became of one message."""

    acks: int = 0
    rejects: list[bool] = field(default_factory=list)


class MainProcess:
    """Celery's strategy of ``task`` in ``app``, driven message by message."""

    hostname = "unit@main"

    def __init__(self, app: Any, task: Any) -> None:
        self.pool = Pool()
        self.scheduled: list[Any] = []
        consumer = SimpleNamespace(
            hostname=self.hostname,
            connection_errors=(),
            event_dispatcher=None,
            timer=SimpleNamespace(call_at=self._call_at),
            apply_eta_task=self._apply_eta_task,
            disable_rate_limits=True,
            task_buckets={},
            on_task_request=self._process_task,
            _limit_task=None,
            _limit_post_eta=None,
            controller=SimpleNamespace(state=worker_state),
            pool=self.pool,
            qos=SimpleNamespace(increment_eventually=lambda: None),
        )
        self.consumer = consumer
        self.handle = task.start_strategy(app, consumer)

    def deliver(
        self, headers: dict[str, Any], body: Any = ((), {}, None), properties: Any = None
    ) -> Delivery:
        """Hand one protocol 2 message (``headers`` as given, ``body`` encoded as JSON)
        to the strategy, as the consumer does."""
        message = Message(
            body=dumps(body),
            content_type="application/json",
            content_encoding="utf-8",
            headers=headers,
            properties=properties or {},
            delivery_info={"exchange": "", "routing_key": "unit"},
        )
        delivery = Delivery()

        def ack(*_: Any) -> None:
            delivery.acks += 1

        def reject(_logger: Any, _errors: Any, requeue: bool = False) -> None:
            delivery.rejects.append(requeue)

        self.handle(message, None, ack, reject, [])
        return delivery

    def _process_task(self, request: Any) -> None:
        """The worker's own (``WorkController._process_task``): a revoked request ends
        there."""
        with suppress(TaskRevokedError):
            request.execute_using_pool(self.pool)

    def _call_at(self, eta: Any, fun: Any, args: Any, priority: int = 0) -> None:
        self.scheduled.append(eta)
        fun(*args)  # the ETA's timer fires at once

    def _apply_eta_task(self, request: Any) -> None:
        worker_state.task_reserved(request)
        self.consumer.on_task_request(request)


def celery_headers(app: Any, task_name: str, task_id: str, **fields: Any) -> dict[str, Any]:
    """The headers Celery writes for a message of ``task_name`` (protocol 2), with
    ``fields`` put in (or over) them as given."""
    message = app.amqp.as_task_v2(task_id, task_name, (), {})
    return {**message.headers, **fields}
