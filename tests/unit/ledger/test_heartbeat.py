"""When the heartbeat's thread is woken: only when it would sleep past a renewal.

The thread itself is not run here: it is stood for by this test's own (alive) thread,
and the instant it sleeps until is set as :meth:`Heartbeat._next_due` sets it. The
renewals themselves are exercised by real workers (tests/integration/ledger/test_ledger.py).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from celery_deadlines.ledger.heartbeat import RENEW_AT, Heartbeat
from celery_deadlines.testing import FakeClock, use_clock

TTL = timedelta(seconds=300)
FIRST_RENEWAL = TTL.total_seconds() * RENEW_AT  # after a watch, by the monotonic clock


class CountingCondition:
    """A condition that counts the wake-ups sent to the thread waiting on it."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self.notified = 0

    def __enter__(self) -> bool:
        return self._condition.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._condition.__exit__(*exc)

    def notify(self, n: int = 1) -> None:
        self.notified += n
        self._condition.notify(n)

    def wait(self, timeout: float | None = None) -> bool:
        raise AssertionError("the test's thread never sleeps")


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    with use_clock(FakeClock()) as fake:
        yield fake


def sleeping(clock: FakeClock, until: float) -> tuple[Heartbeat, CountingCondition]:
    """A heartbeat whose thread is alive and sleeps until ``until`` (monotonic, relative
    to now; ``inf``: until woken, ``-inf``: awake)."""
    beat = Heartbeat()
    condition = CountingCondition()
    beat._wakeup = condition  # type: ignore[assignment]
    beat._thread = threading.current_thread()
    beat._asleep_until = clock.monotonic() + until
    return beat, condition


class Attempt:
    """What the heartbeat reads of an attempt (kept by identity, as the real one)."""

    def __init__(self, ttl: timedelta) -> None:
        self.ttl = ttl
        self.lease = SimpleNamespace(deadline=None)
        self.pulled_in: Any = None
        self.cancelled = False
        #: the run's deadline a cancel pulled in, as a refused renewal reads it
        self.cancelled_at: datetime | None = None

    def cancelled_deadline(self) -> datetime | None:
        return self.cancelled_at


def attempt(ttl: timedelta = TTL) -> Any:
    return Attempt(ttl)


@pytest.mark.parametrize(
    ("asleep_for", "woken"),
    [
        (FIRST_RENEWAL - 10, 0),  # the attempt before it, due first: its renewal wakes it
        (FIRST_RENEWAL, 0),
        (FIRST_RENEWAL + 10, 1),
        (math.inf, 1),  # nothing was due: it sleeps until woken
        (-math.inf, 0),  # awake: it looks at what is due before it sleeps again
    ],
    ids=["earlier", "same", "later", "until-woken", "awake"],
)
def test_a_watched_attempt_wakes_the_thread_only_if_it_would_sleep_past_its_renewal(
    clock: FakeClock, asleep_for: float, woken: int
) -> None:
    beat, condition = sleeping(clock, asleep_for)
    beat.watch(attempt())
    assert condition.notified == woken


def test_one_attempt_after_another_never_wakes_the_thread_of_a_process_running_them(
    clock: FakeClock,
) -> None:
    beat, condition = sleeping(clock, FIRST_RENEWAL)  # asleep for the first attempt
    for _ in range(50):
        clock.advance(0.01)
        running = attempt()
        beat.watch(running)
        beat.forget(running)
    assert condition.notified == 0


def test_a_shorter_lease_than_the_one_the_thread_sleeps_for_wakes_it(
    clock: FakeClock,
) -> None:
    beat, condition = sleeping(clock, FIRST_RENEWAL)
    beat.watch(attempt(ttl=TTL / 2))
    assert condition.notified == 1


def test_an_attempt_due_now_is_returned_awake_and_later_ones_sleep_until_their_renewal(
    clock: FakeClock,
) -> None:
    beat, _ = sleeping(clock, -math.inf)
    due = attempt()
    beat._due[due] = clock.monotonic() - 1
    assert beat._next_due() is due
    assert beat._asleep_until == -math.inf


class Store:
    """A store the heartbeat renews on: how many times its thread closed it."""

    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class Renewed(Attempt):
    """An attempt whose renewal finds its lease gone (its run ended meanwhile)."""

    def __init__(self, store: Store) -> None:
        super().__init__(TTL)
        self.store = store

    def renew(self) -> None:
        return None


def renewed(store: Store) -> Any:
    return Renewed(store)


def test_the_heartbeat_closes_its_connections_once_it_has_no_lease_left_to_renew(
    clock: FakeClock,
) -> None:
    # a test suite's database can be dropped, and a web process keeps none open, after
    # an eager run that outlived a renewal (tests/django/test_eager_runs.py)
    beat, _ = sleeping(clock, math.inf)
    store, other = Store(), Store()
    first, second = renewed(store), renewed(other)
    beat.watch(first)
    beat.watch(second)
    clock.advance(FIRST_RENEWAL)
    assert beat._next_due() == first
    beat._renew_now(first)  # its lease is gone: no longer due
    assert beat._next_due() == second  # still one to renew: nothing closed
    assert (store.closed, other.closed) == (0, 0)
    beat._renew_now(second)
    assert beat._next_due() is None  # none left: closed, instead of sleeping
    assert (store.closed, other.closed, beat._used) == (1, 1, set())


def test_forgetting_the_last_attempt_wakes_the_heartbeat_only_to_close_its_connections(
    clock: FakeClock,
) -> None:
    beat, condition = sleeping(clock, math.inf)
    quiet, last = renewed(Store()), renewed(Store())
    beat.watch(quiet)
    woken = condition.notified
    beat.forget(quiet)  # nothing renewed, nothing to close: the thread sleeps on
    assert condition.notified == woken
    beat.watch(last)
    beat._used.add(last.store)  # as its renewal did
    woken = condition.notified
    beat.forget(last)
    assert condition.notified == woken + 1


def test_a_renewal_refused_for_a_cancel_pulls_the_attempts_deadline_in_once(
    clock: FakeClock,
) -> None:
    beat, _ = sleeping(clock, math.inf)
    cancelled = renewed(Store())
    cancelled.cancelled_at = datetime(2026, 12, 5, 6, 0, tzinfo=UTC)
    told: list[tuple[datetime, float]] = []
    cancelled.pulled_in = lambda deadline, monotonic: told.append((deadline, monotonic))
    beat.watch(cancelled)
    clock.advance(FIRST_RENEWAL)
    beat._renew_now(cancelled)
    assert cancelled.cancelled
    assert told == [(cancelled.cancelled_at, clock.monotonic())]
    assert beat._next_due() is None  # its lease is gone: nothing left to renew


def test_a_renewal_refused_for_anything_else_pulls_nothing_in(clock: FakeClock) -> None:
    beat, _ = sleeping(clock, math.inf)
    gone = renewed(Store())
    told: list[Any] = []
    gone.pulled_in = lambda *seen: told.append(seen)
    beat.watch(gone)
    clock.advance(FIRST_RENEWAL)
    beat._renew_now(gone)
    assert (gone.cancelled, told) == (False, [])
