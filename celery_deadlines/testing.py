"""Helpers for testing code that uses celery-deadlines (public, stable).

``FakeClock`` is a clock you move by hand: ``advance()`` moves both readings (time
passing), ``jump_wall()`` moves only the wall clock (NTP step, VM resume), which is how
tests prove that enforcement runs on the monotonic clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from .clock import set_clock


class FakeClock:
    """A :class:`celery_deadlines.clock.Clock` that only moves when told to."""

    def __init__(self, start: datetime | None = None, monotonic: float = 1_000.0) -> None:
        # A fixed instant after any real "now" this code will meet, so that Celery's own
        # checks (which read the real clock) never see a fake deadline as already past.
        start = start or datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError("FakeClock needs an aware start instant")
        self._now = start.astimezone(UTC)
        self._monotonic = monotonic

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float = 0.0, **delta: float) -> None:
        """Let time pass: both clocks move forward together."""
        step = timedelta(seconds=seconds, **delta)
        if step < timedelta(0):
            raise ValueError("time does not pass backwards; use jump_wall()")
        self._now += step
        self._monotonic += step.total_seconds()

    def jump_wall(self, seconds: float) -> None:
        """Step the wall clock only (either way); the monotonic clock does not notice."""
        self._now += timedelta(seconds=seconds)


@contextmanager
def use_clock(clock: FakeClock) -> Iterator[FakeClock]:
    """Install ``clock`` for the duration of the block."""
    previous = set_clock(clock)
    try:
        yield clock
    finally:
        set_clock(previous)
