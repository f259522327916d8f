"""The one place that reads the time.

Two readings, two purposes (docs/explanation/clocks-and-gates.md: persist instants, measure
durations locally):

* ``now()`` is an aware UTC wall-clock instant. It is what goes on the wire and what a
  deadline is compared with when a worker first sees a message.
* ``monotonic()`` is seconds on a clock that never jumps. Once an attempt has started,
  every "how long is left" question is answered on it, so an NTP step, a VM resume or an
  operator changing the date during the attempt neither adds nor removes budget.

:func:`epoch` is ``now()`` in epoch seconds, the wire's own unit, for the gates a worker
passes every message through: a deadline header is compared with it as it comes, with
no datetime built on either side (they cost more than the rest of such a gate), and
:func:`monotonic` is the installed clock's ``monotonic()`` for the timers it sets. Read
them as ``clock.epoch()`` and ``clock.monotonic()``: :func:`set_clock` rebinds the names
(``from .clock import epoch`` would keep the clock of the moment it ran).

Tests inject a :class:`celery_deadlines.testing.FakeClock`. Worker *subprocesses* in the
integration tests cannot take an object, so :class:`SystemClock` has one test-only seam:
when the environment variable ``CELERY_DEADLINES_TESTING_WALL_CLOCK_SHIFT_FILE`` names a
file, the number of seconds written in it is added to every wall-clock reading (re-read
on each call, so a test can jump a running worker's clock). It is off unless that
variable is set, and it never touches ``monotonic()``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

logger = logging.getLogger(__name__)

#: Environment variable that enables the wall-clock shift seam (tests only).
WALL_CLOCK_SHIFT_FILE_ENV = "CELERY_DEADLINES_TESTING_WALL_CLOCK_SHIFT_FILE"


class Clock(Protocol):
    """What celery-deadlines needs from a clock."""

    def now(self) -> datetime:
        """The current instant, an aware UTC datetime."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; only differences mean anything."""
        ...


class SystemClock:
    """The operating system's clocks (with the test-only wall-clock seam described above)."""

    def __init__(self, shift_file: str | None = None) -> None:
        self._shift_file = shift_file
        if shift_file:
            logger.warning(
                "celery-deadlines: wall clock is shifted by the contents of %s "
                "(test seam %s is set; never set it in production)",
                shift_file,
                WALL_CLOCK_SHIFT_FILE_ENV,
            )

    def now(self) -> datetime:
        instant = datetime.now(UTC)
        if self._shift_file:
            instant += timedelta(seconds=self._read_shift())
        return instant

    def monotonic(self) -> float:
        return time.monotonic()

    def _read_shift(self) -> float:
        try:
            with open(self._shift_file or "", encoding="ascii") as handle:
                return float(handle.read().strip() or 0)
        except (OSError, ValueError):
            return 0.0


def _epoch_of(clock: Clock) -> Callable[[], float]:
    """``clock``'s wall clock in epoch seconds: the system's own, unless a test seam or
    another clock is installed, then what its ``now()`` says."""
    if type(clock) is SystemClock and not clock._shift_file:
        return time.time
    return lambda: clock.now().timestamp()


def _monotonic_of(clock: Clock) -> Callable[[], float]:
    """``clock``'s monotonic clock: the system's own, unless another clock is installed."""
    return time.monotonic if type(clock) is SystemClock else clock.monotonic


_clock: Clock = SystemClock(os.environ.get(WALL_CLOCK_SHIFT_FILE_ENV) or None)
#: The installed clock's ``now()`` in epoch seconds (rebound by :func:`set_clock`).
epoch: Callable[[], float] = _epoch_of(_clock)
#: The installed clock's ``monotonic()`` (rebound by :func:`set_clock`).
monotonic: Callable[[], float] = _monotonic_of(_clock)


def get_clock() -> Clock:
    """The clock every gate and task reads."""
    return _clock


def set_clock(clock: Clock) -> Clock:
    """Install ``clock`` for the whole process and return the previous one (tests use this)."""
    global _clock, epoch, monotonic
    previous, _clock = _clock, clock
    epoch = _epoch_of(clock)
    monotonic = _monotonic_of(clock)
    return previous
