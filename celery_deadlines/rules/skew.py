"""The clock-skew budget and the clock-skew gate (pure rules; docs/explanation/run-ledger.md).

A worker's wall clock is trusted only as far as it agrees with the authority clock
(the ledger's database). A :class:`ClockReading` is one measurement: the authority's
time read between two local readings gives the offset (authority minus the local
midpoint) and its uncertainty (half the round trip). The error bound is
``|offset| + uncertainty``; above the budget the worker must not dispatch new work.

:func:`gate` decides in this order, which is deliberate: a job that is due is
not dispatched while the clock that says so is in doubt.

1. ``CLOCK_UNCERTAIN``: no reading, or its error bound exceeds the budget;
2. ``NOT_READY``: the authority-corrected time is before ``not_before``;
3. ``EXPIRED``: it is at or past the deadline;
4. ``DISPATCHABLE``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta

from .budgets import parse_instant


class Readiness(enum.StrEnum):
    CLOCK_UNCERTAIN = "CLOCK_UNCERTAIN"
    NOT_READY = "NOT_READY"
    EXPIRED = "EXPIRED"
    DISPATCHABLE = "DISPATCHABLE"


@dataclass(frozen=True, slots=True)
class ClockReading:
    """How far the local wall clock is from the authority's, and how sure we are."""

    offset: timedelta  # authority - local: add it to a local reading
    uncertainty: timedelta  # half the round trip of the measurement

    @classmethod
    def between(
        cls, local_before: datetime, authority: datetime, local_after: datetime
    ) -> ClockReading:
        """A reading from the authority's time taken between two local readings."""
        for name, value in (
            ("local_before", local_before),
            ("authority", authority),
            ("local_after", local_after),
        ):
            parse_instant(value, name=name)
        round_trip = local_after - local_before
        if round_trip < timedelta(0):
            # the local clock stepped back during the measurement: it proves nothing
            return cls(timedelta(0), timedelta.max)
        midpoint = local_before + round_trip / 2
        return cls(authority - midpoint, round_trip / 2)

    @property
    def error_bound(self) -> timedelta:
        if self.uncertainty == timedelta.max:
            return timedelta.max
        return abs(self.offset) + self.uncertainty

    def within(self, budget: timedelta) -> bool:
        return self.error_bound <= budget

    def corrected(self, local: datetime) -> datetime:
        """A local reading, moved onto the authority's clock."""
        return local + self.offset


def gate(
    local_now: datetime,
    reading: ClockReading | None,
    budget: timedelta,
    *,
    not_before: datetime | None = None,
    deadline: datetime | None = None,
) -> Readiness:
    """May work due at ``not_before`` and expiring at ``deadline`` be dispatched now?"""
    if reading is None or not reading.within(budget):
        return Readiness.CLOCK_UNCERTAIN
    now = reading.corrected(local_now)
    if not_before is not None and now < not_before:
        return Readiness.NOT_READY
    if deadline is not None and now >= deadline:
        return Readiness.EXPIRED
    return Readiness.DISPATCHABLE


def describe(reading: ClockReading | None) -> str:
    """A reading as the logs say it."""
    if reading is None:
        return "the ledger's clock could not be read"
    return (
        f"offset {reading.offset.total_seconds():+.3f} s "
        f"(+/- {reading.uncertainty.total_seconds():.3f} s)"
    )
