"""The worker's clock watch: hold on an uncertain clock, release when it agrees again."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from celery_deadlines.ledger.clockwatch import ClockWatch
from celery_deadlines.signals import clock_certain, clock_uncertain
from celery_deadlines.testing import FakeClock, use_clock

NOW = datetime(2026, 8, 19, 8, 0, tzinfo=UTC)


class Authority:
    """The ledger's clock: ``offset`` from the worker's, or unreachable."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.offset = timedelta(0)
        self.down = False

    def database_now(self) -> datetime:
        if self.down:
            raise ConnectionError("database unreachable")
        self.round_trip = (self.clock.now(), self.clock.now())
        return self.clock.now() + self.offset

    def last_round_trip(self) -> tuple[datetime, datetime]:
        return self.round_trip

    def close(self) -> None:
        pass


class Queues(dict[str, Any]):
    def select_add(self, queue: Any) -> None:
        self.selected = queue


class Consumer:
    """What ClockWatch uses of Celery's consumer (no hub: changes apply at once)."""

    def __init__(self) -> None:
        self.consuming = {"orders", "mail"}
        self.task_consumer = self
        self.app = SimpleNamespace(amqp=SimpleNamespace(queues=Queues(orders=1, mail=2)))

    @property
    def queues(self) -> list[Any]:
        return [SimpleNamespace(name=name) for name in sorted(self.consuming)]

    def cancel_task_queue(self, name: str) -> None:
        self.consuming.discard(name)

    def add_task_queue(self, name: str) -> None:
        self.consuming.add(name)


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    with use_clock(FakeClock(NOW)) as fake:
        yield fake


@pytest.fixture
def signals() -> Iterator[list[str]]:
    sent: list[str] = []

    def uncertain(**_: Any) -> None:
        sent.append("uncertain")

    def certain(**_: Any) -> None:
        sent.append("certain")

    clock_uncertain.connect(uncertain, weak=False)
    clock_certain.connect(certain, weak=False)
    yield sent
    clock_uncertain.disconnect(uncertain)
    clock_certain.disconnect(certain)


def watch(authority: Authority, consumer: Consumer) -> ClockWatch:
    return ClockWatch(authority, timedelta(milliseconds=500), consumer)  # type: ignore[arg-type]


def test_a_clock_beyond_the_budget_stops_consumption_until_it_agrees_again(
    clock: FakeClock, signals: list[str]
) -> None:
    authority, consumer = Authority(clock), Consumer()
    watcher = watch(authority, consumer)
    watcher.check()
    assert (watcher.uncertain, consumer.consuming) == (False, {"orders", "mail"})
    authority.offset = timedelta(minutes=-10)  # the worker's clock jumped forward
    reading = watcher.check()
    assert reading is not None
    assert reading.offset == timedelta(minutes=-10)
    assert (watcher.uncertain, consumer.consuming) == (True, set())
    watcher.check()  # still out: nothing changes, nothing is sent twice
    authority.offset = timedelta(milliseconds=100)
    watcher.check()
    assert (watcher.uncertain, consumer.consuming) == (False, {"orders", "mail"})
    assert signals == ["uncertain", "certain"]


def test_an_unreachable_database_clock_holds_the_worker(
    clock: FakeClock, signals: list[str]
) -> None:
    authority, consumer = Authority(clock), Consumer()
    watcher = watch(authority, consumer)
    authority.down = True
    assert watcher.check() is None
    assert (watcher.uncertain, consumer.consuming) == (True, set())
    assert signals == ["uncertain"]


def test_late_or_reordered_loop_callbacks_converge_on_the_current_state(
    clock: FakeClock,
) -> None:
    authority, consumer = Authority(clock), Consumer()
    pending: list[Any] = []
    consumer.hub = SimpleNamespace(call_soon=pending.append)  # type: ignore[attr-defined]
    watcher = watch(authority, consumer)
    authority.offset = timedelta(minutes=10)
    watcher.check()  # hold queued
    authority.offset = timedelta(0)
    watcher.check()  # release queued
    for callback in reversed(pending):  # the loop runs them in the other order
        callback()
    assert consumer.consuming == {"orders", "mail"}


def test_the_ledgers_time_is_estimated_on_the_monotonic_clock_after_a_wall_clock_step(
    clock: FakeClock,
) -> None:
    authority = Authority(clock)
    authority.offset = timedelta(seconds=0.2)
    watch = ClockWatch(authority, timedelta(seconds=0.5), Consumer())  # type: ignore[arg-type]
    watch.check()
    clock.advance(30)
    clock.jump_wall(600)  # an NTP step after the reading: the estimate does not move
    assert watch.authority_now() == NOW + timedelta(seconds=30.2)


def test_no_time_is_estimated_while_the_clock_is_uncertain_or_never_read(
    clock: FakeClock,
) -> None:
    authority = Authority(clock)
    watch = ClockWatch(authority, timedelta(seconds=0.5), Consumer())  # type: ignore[arg-type]
    assert watch.authority_now() is None  # never read
    authority.offset = timedelta(seconds=5)
    watch.check()
    assert watch.authority_now() is None
    authority.offset, authority.down = timedelta(0), True
    watch.check()
    assert watch.authority_now() is None


def test_a_suspected_clock_is_measured_again_at_once_not_at_the_next_pass(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_deadlines.ledger import reconcile

    monkeypatch.setattr(reconcile, "reconcile_once", lambda *args, **kwargs: None)
    authority = Authority(clock)
    measured = threading.Semaphore(0)
    read = authority.database_now

    def database_now() -> datetime:
        value = read()
        measured.release()
        return value

    authority.database_now = database_now  # type: ignore[method-assign]
    watch = ClockWatch(authority, timedelta(seconds=0.5), Consumer())  # type: ignore[arg-type]
    hourly = reconcile.Reconciler(None, authority, timedelta(hours=1), watch)  # type: ignore[arg-type]
    hourly.start()
    try:
        assert measured.acquire(timeout=5)  # the pass at start
        watch.suspect()  # e.g. the claim gate saw the wall clock disagree
        assert measured.acquire(timeout=5)  # measured again now, not in an hour
    finally:
        hourly.stop()
