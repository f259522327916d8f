"""One event-loop timer for every job's time limits (celery_deadlines.core.timelimits), on a
fake clock and a fake event loop that fires a timer when the clock reaches it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery.concurrency.asynpool import AsynPool
from celery.signals import worker_init

from celery_deadlines.core import timelimits
from celery_deadlines.core.timelimits import JobLimits
from celery_deadlines.testing import FakeClock, use_clock


class Entry:
    def __init__(self, at: float, callback: Callable[[], None]) -> None:
        self.at, self.callback, self.cancelled = at, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class Hub:
    """kombu's hub as JobLimits uses it: ``call_later``, and the loop firing what is due."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.entries: list[Entry] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> Entry:
        entry = Entry(self.clock.monotonic() + delay, callback)
        self.entries.append(entry)
        return entry

    def set(self) -> list[Entry]:
        return [entry for entry in self.entries if not entry.cancelled]

    def run_until(self, seconds: float) -> None:
        """Let ``seconds`` pass, firing each timer when its instant comes."""
        end = self.clock.monotonic() + seconds
        while due := [e for e in self.set() if e.at <= end]:
            entry = min(due, key=lambda e: e.at)
            self.clock.advance(entry.at - self.clock.monotonic())
            entry.cancelled = True  # fired: kombu drops it
            entry.callback()
        self.clock.advance(end - self.clock.monotonic())


class Pool:
    """What JobLimits calls of Celery's AsynPool, recorded with the instant."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.calls: list[tuple[str, int, float]] = []
        self._tref_for_id: dict[int, Any] = {}
        self.discarded: list[int] = []

    def _on_soft_timeout(self, job: int, soft: float, hard: float | None, hub: Any) -> None:
        self.calls.append(("soft", job, self.clock.monotonic()))

    def _on_hard_timeout(self, job: int) -> None:
        self.calls.append(("hard", job, self.clock.monotonic()))

    def _discard_tref(self, job: int) -> None:
        self.discarded.append(job)
        self._tref_for_id.pop(job, None)


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    with use_clock(FakeClock(monotonic=100.0)) as fake:
        yield fake


@pytest.fixture
def hub(clock: FakeClock) -> Hub:
    return Hub(clock)


@pytest.fixture
def pool(clock: FakeClock) -> Pool:
    return Pool(clock)


def job(number: int) -> Any:
    return SimpleNamespace(_job=number)


def test_a_hard_limit_is_applied_at_its_instant_and_not_before(hub: Hub, pool: Pool) -> None:
    limits = JobLimits(pool, hub)
    limits.on_timeout_set(job(1), None, 30.0)
    hub.run_until(29.9)
    assert pool.calls == []
    hub.run_until(0.2)
    assert pool.calls == [("hard", 1, 130.0)]


def test_a_soft_limit_comes_first_and_leaves_the_hard_one_to_celery(hub: Hub, pool: Pool) -> None:
    limits = JobLimits(pool, hub)
    limits.on_timeout_set(job(1), 10.0, 30.0)
    hub.run_until(60)
    assert pool.calls == [("soft", 1, 110.0)]  # Celery's _on_soft_timeout sets the hard one


def test_a_job_that_ended_has_no_limit_applied(hub: Hub, pool: Pool) -> None:
    limits = JobLimits(pool, hub)
    limits.on_timeout_set(job(1), None, 5.0)
    limits.on_timeout_cancel(job(1))
    hub.run_until(60)
    assert pool.calls == []
    assert hub.set() == []  # the timer found nothing due and was not set again


def test_many_jobs_share_one_timer_set_for_the_earliest_limit(hub: Hub, pool: Pool) -> None:
    limits = JobLimits(pool, hub)
    for number, hard in ((1, 30.0), (2, 40.0), (3, 50.0)):
        limits.on_timeout_set(job(number), None, hard)
    assert len(hub.entries) == 1
    limits.on_timeout_cancel(job(1))
    hub.run_until(45)
    assert pool.calls == [("hard", 2, 140.0)]
    hub.run_until(10)
    assert pool.calls == [("hard", 2, 140.0), ("hard", 3, 150.0)]


def test_an_earlier_limit_sets_the_timer_earlier(hub: Hub, pool: Pool) -> None:
    limits = JobLimits(pool, hub)
    limits.on_timeout_set(job(1), None, 30.0)
    limits.on_timeout_set(job(2), None, 5.0)
    assert len(hub.set()) == 1
    hub.run_until(31)
    assert pool.calls == [("hard", 2, 105.0), ("hard", 1, 130.0)]


def test_limits_that_come_together_are_applied_at_one_firing(hub: Hub, pool: Pool) -> None:
    limits = JobLimits(pool, hub)
    limits.on_timeout_set(job(1), None, 10.0)
    limits.on_timeout_set(job(2), None, 10.0)
    hub.run_until(10)
    assert sorted(pool.calls) == [("hard", 1, 110.0), ("hard", 2, 110.0)]


def test_a_limit_set_while_others_are_applied_does_not_delay_an_earlier_one(
    hub: Hub, pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    limits = JobLimits(pool, hub)
    applied = pool._on_hard_timeout

    def starting_another(job_number: int) -> None:
        applied(job_number)
        if job_number == 1:  # a pool process took the next job meanwhile
            limits.on_timeout_set(job(9), None, 100.0)

    monkeypatch.setattr(pool, "_on_hard_timeout", starting_another)
    limits.on_timeout_set(job(1), None, 10.0)
    limits.on_timeout_set(job(2), None, 20.0)
    hub.run_until(25)
    assert pool.calls == [("hard", 1, 110.0), ("hard", 2, 120.0)]


def test_a_job_without_limits_sets_nothing(hub: Hub, pool: Pool) -> None:
    limits = JobLimits(pool, hub)
    limits.on_timeout_set(job(1), None, None)
    limits.on_timeout_set(job(2), 0, 0)
    limits.on_timeout_cancel(job(1))
    assert hub.entries == []
    assert pool.discarded == []  # no Celery timer to discard either


def test_the_hard_timer_celery_set_after_a_soft_limit_is_discarded_when_the_job_ends(
    hub: Hub, pool: Pool
) -> None:
    limits = JobLimits(pool, hub)
    limits.on_timeout_set(job(1), 10.0, 30.0)
    hub.run_until(10)
    pool._tref_for_id[1] = object()  # what Celery's _on_soft_timeout keeps
    limits.on_timeout_cancel(job(1))
    assert pool.discarded == [1]


def test_one_jobs_failing_limit_does_not_keep_the_others_off(
    hub: Hub, pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    limits = JobLimits(pool, hub)
    applied = pool._on_hard_timeout

    def fails_for_job_1(job: int) -> None:
        if job == 1:
            raise RuntimeError("the process was gone")
        applied(job)

    monkeypatch.setattr(pool, "_on_hard_timeout", fails_for_job_1)
    limits.on_timeout_set(job(1), None, 10.0)
    limits.on_timeout_set(job(2), None, 10.0)
    limits.on_timeout_set(job(3), None, 20.0)
    hub.run_until(30)
    assert pool.calls == [("hard", 2, 110.0), ("hard", 3, 120.0)]


def test_a_new_event_loop_after_a_reconnection_gets_the_running_jobs_limits(
    clock: FakeClock, hub: Hub, pool: Pool
) -> None:
    limits = JobLimits(pool, hub)
    limits.on_timeout_set(job(1), None, 30.0)
    other = Hub(clock)
    limits.rebind(other)
    assert hub.set() == []
    other.run_until(30)
    assert pool.calls == [("hard", 1, 130.0)]


def test_patch_gives_every_asynpool_the_shared_timer_and_unpatch_takes_it_back() -> None:
    found = AsynPool.__dict__["_create_timelimit_handlers"]  # patched by a worker started here?
    timelimits.unpatch()
    original = AsynPool.__dict__["_create_timelimit_handlers"]
    try:
        timelimits.patch()
        timelimits.patch()  # idempotent
        patched = AsynPool.__dict__["_create_timelimit_handlers"]
        assert patched.__wrapped__ is original
        pool: Any = object.__new__(AsynPool)  # what the handlers need of a pool: nothing else
        patched(pool, SimpleNamespace(call_later=None))
        limits = pool._celery_deadlines_job_limits
        assert pool.on_timeout_set == limits.on_timeout_set
        assert pool.on_timeout_cancel == limits.on_timeout_cancel
        patched(pool, SimpleNamespace(call_later=None))  # registered again: the same limits
        assert pool._celery_deadlines_job_limits is limits
    finally:
        timelimits.unpatch()
    assert AsynPool.__dict__["_create_timelimit_handlers"] is original
    if found is not original:
        timelimits.patch()  # as the test found it


def test_a_worker_patches_asynpool_when_it_starts() -> None:
    found = AsynPool.__dict__["_create_timelimit_handlers"]
    timelimits.unpatch()
    try:
        timelimits.connect()
        worker_init.send(sender=None)
        assert hasattr(AsynPool.__dict__["_create_timelimit_handlers"], "__wrapped__")
    finally:
        timelimits.unpatch()
        if hasattr(found, "__wrapped__"):
            timelimits.patch()


def test_jobs_that_end_before_their_limits_leave_nothing_behind_but_one_timer(
    hub: Hub, pool: Pool
) -> None:
    # Celery's own timer per job stays in the event loop's heap, cancelled, until its
    # limit's instant: a worker kept ~500 bytes per DeadlineTask for its budget's length
    limits = JobLimits(pool, hub)
    for number in range(1000):
        limits.on_timeout_set(job(number), None, 300.0 + number)
        limits.on_timeout_cancel(job(number))
    assert limits.due == {}
    assert len(hub.entries) == 1


# -- a cancel's hard limit (JobLimits.fall) ------------------------------------------------


def test_a_cancel_pulls_a_jobs_hard_limit_in_to_the_instant_it_names(hub: Hub, pool: Pool) -> None:
    limits = JobLimits(pool, hub)
    limits.on_timeout_set(job(1), None, 300.0)
    hub.run_until(10)
    limits.fall(1, 2.0)
    hub.run_until(1.9)
    assert pool.calls == []
    hub.run_until(0.2)
    assert pool.calls == [("hard", 1, 112.0)]
    hub.run_until(300)
    assert pool.calls == [("hard", 1, 112.0)]  # its own limit is not applied after


def test_a_cancel_never_puts_a_limit_off(hub: Hub, pool: Pool) -> None:
    limits = JobLimits(pool, hub)
    limits.on_timeout_set(job(1), None, 3.0)
    limits.fall(1, 2.0)
    limits.fall(1, 20.0)  # a second, later one changes nothing
    hub.run_until(60)
    assert pool.calls == [("hard", 1, 102.0)]


def test_a_jobs_own_soft_limit_before_the_fallen_hard_one_still_comes_first(
    hub: Hub, pool: Pool
) -> None:
    limits = JobLimits(pool, hub)
    limits.on_timeout_set(job(1), 1.0, 300.0)
    limits.fall(1, 2.0)
    hub.run_until(60)
    assert pool.calls == [("soft", 1, 101.0), ("hard", 1, 102.0)]


def test_a_cancelled_job_that_ended_before_its_fallen_limit_is_left_alone(
    hub: Hub, pool: Pool
) -> None:
    limits = JobLimits(pool, hub)
    limits.on_timeout_set(job(1), None, 300.0)
    limits.on_timeout_set(job(2), None, 300.0)
    limits.fall(1, 2.0)
    limits.on_timeout_cancel(job(1))
    hub.run_until(60)
    assert pool.calls == []
    assert limits.fallen == {}
    assert list(limits.due) == [2]


def test_only_a_running_job_of_a_pool_that_applies_hard_limits_has_its_limit_fall(
    hub: Hub, pool: Pool
) -> None:
    """timelimits.fall: prefork's jobs by their number; a job that has ended (its
    request's reference gone), and a job of a pool without hard limits (threads, solo:
    an ``ApplyResult`` Celery keeps no timer for), have none to fall."""
    limits = JobLimits(pool, hub)
    setattr(pool, timelimits._MARK, limits)
    prefork = SimpleNamespace(_pool=pool)
    limits.on_timeout_set(job(7), None, 300.0)
    running = SimpleNamespace(_apply_result=lambda: job(7))
    assert timelimits.fall(prefork, running, 2.0)
    assert limits.fallen == {7: 102.0}
    assert not timelimits.fall(prefork, SimpleNamespace(_apply_result=lambda: None), 2.0)
    assert not timelimits.fall(prefork, SimpleNamespace(_apply_result=None), 2.0)
    threads = SimpleNamespace(_pool=SimpleNamespace())
    assert not timelimits.fall(threads, SimpleNamespace(_apply_result=lambda: object()), 2.0)
