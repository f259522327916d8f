"""A worker's report of what it holds (core/workload.py): which queue a message it took
counts in; and the reading of a RabbitMQ queue beside the reports (core/backlog.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kombu import Exchange, Queue

from celery_deadlines.core.backlog import _declared
from celery_deadlines.core.workload import _Counts, bindings


def message(exchange: object, routing_key: object) -> SimpleNamespace:
    return SimpleNamespace(delivery_info={"exchange": exchange, "routing_key": routing_key})


def test_a_message_counts_in_the_queue_its_exchange_and_routing_key_are_bound_to() -> None:
    queues = [
        Queue("payments", Exchange("payments"), "payments"),
        Queue("mail", Exchange("mail"), "mail"),
    ]
    counts = _Counts(bindings(queues), None)
    assert counts.queue_of(message("payments", "payments")) == "payments"
    assert counts.queue_of(message("mail", "mail")) == "mail"
    assert counts.queue_of(message("mail", "payments")) is None


def test_a_binding_two_queues_share_counts_in_neither() -> None:
    shared = Exchange("shared", type="direct")
    queues = [Queue("a", shared, "x"), Queue("b", shared, "x"), Queue("c", shared, "y")]
    assert bindings(queues) == {("shared", "y"): "c"}


def test_a_worker_of_one_queue_counts_every_message_in_it_and_a_hostile_one_in_none() -> None:
    assert _Counts({}, "payments").queue_of(message(["x"], {"y": 1})) == "payments"
    counts = _Counts(bindings([Queue("payments", Exchange("payments"), "payments")]), None)
    assert counts.queue_of(message(["x"], {"y": 1})) is None  # unhashable: no queue's
    assert counts.queue_of(SimpleNamespace(delivery_info=None)) is None
    assert counts.queue_of(SimpleNamespace(delivery_info=["payments"])) is None


class Channel:
    def __init__(self, missing: set[str]) -> None:
        self.is_open = True
        self.missing = missing

    def queue_declare(self, queue: str, passive: bool) -> SimpleNamespace:
        assert passive
        if queue in self.missing:
            self.is_open = False  # RabbitMQ closes the channel a missing queue is asked on
            raise LookupError(queue)
        return SimpleNamespace(message_count=7, consumer_count=2)

    def close(self) -> None:
        self.is_open = False


class Connection:
    def __init__(self) -> None:
        self.opened: list[Channel] = []

    def channel(self) -> Channel:
        self.opened.append(Channel({"missing"}))
        return self.opened[-1]


def test_a_rabbitmq_queue_is_read_on_one_channel_kept_until_a_reading_fails() -> None:
    connection = Connection()
    assert _declared(connection, "payments") == (7, 2)
    assert _declared(connection, "payments") == (7, 2)
    assert len(connection.opened) == 1  # no channel opened a reading
    with pytest.raises(LookupError):
        _declared(connection, "missing")
    assert _declared(connection, "payments") == (7, 2)
    assert len(connection.opened) == 2
