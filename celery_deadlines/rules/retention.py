"""Retention: how long ended runs stay in the ledger, and when they may go. Pure rules.

The ledger purges a run only when it ended (SUCCEEDED, FAILED or EXPIRED) longer ago
than the retention, by the database clock, and only with all of its effects: a run is
kept whole while one of its effects could still be asked for (the SQL is
:mod:`celery_deadlines.ledger.sql.retention`; the rule is drawn in docs/explanation/run-ledger.md,
"Retention"). What is decided here, without a clock or a database:

* the retention setting (``deadlines_retention``: ``None`` or ``0`` turns the workers'
  periodic purge off) and an operator's ``--older-than`` (``14d``, ``36h``, ``P2W``,
  ``PT90M``, seconds);
* the cutoff (``now - older_than``), read once per purge so that every batch and the
  dry run agree;
* whether a worker's reconcile pass purges now (:func:`purge_due`), and how many
  batches a pass may run (:data:`MAX_BATCHES_PER_PASS`), so that a pass never stalls
  the reconciler;
* what a purge did (:class:`PurgeCounts`).
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Final

from ..errors import InvalidDeadline
from .budgets import LONGEST, parse_duration, parse_instant, too_long
from .quoting import shown

#: How long an ended run stays when ``deadlines_retention`` is not set.
DEFAULT_RETENTION: Final = timedelta(days=14)
#: A worker's reconciler purges at most once per this interval (unless it is behind).
PURGE_INTERVAL: Final = timedelta(hours=1)
#: Runs deleted per batch (one transaction) by the reconciler and by default by the command.
BATCH_SIZE: Final = 500
#: The largest batch the command accepts (a batch's ids are statement parameters).
MAX_BATCH_SIZE: Final = 10_000
#: Batches one reconcile pass may run; a pass that stops here with more to purge goes on
#: at the next reconcile pass instead of waiting for :data:`PURGE_INTERVAL`.
MAX_BATCHES_PER_PASS: Final = 4

_UNITS: Final = {"w": 604_800.0, "d": 86_400.0, "h": 3_600.0, "m": 60.0, "s": 1.0}
_NUMBER: Final = r"[0-9]+(?:\.[0-9]+)?"  # ASCII: an operator's digits, not any script's
_SHORT: Final = re.compile(rf"(?:{_NUMBER}[wdhms])+")
_SHORT_PART: Final = re.compile(rf"({_NUMBER})([wdhms])")
_ISO: Final = re.compile(
    rf"P(?:(?P<w>{_NUMBER})W|(?:(?P<d>{_NUMBER})D)?"
    rf"(?:T(?:(?P<h>{_NUMBER})H)?(?:(?P<m>{_NUMBER})M)?(?:(?P<s>{_NUMBER})S)?)?)"
)
_FORMS: Final = (
    "a number of seconds (3600), a number and a unit w, d, h, m or s (14d, 36h, 1d12h) "
    "or an ISO 8601 duration (P14D, PT36H, P2W)"
)


def parse_age(value: object, *, name: str) -> timedelta:
    """An age as an operator writes it: seconds (a number, or a number as text), a
    number and a unit (``14d``, ``36h``, ``90m``, ``2w``, ``1d12h``) or an ISO 8601
    duration (``P14D``, ``PT36H``, ``P1DT12H``, ``P2W``; years and months have no fixed
    length and are refused). More than zero; :class:`InvalidDeadline` otherwise."""
    if not isinstance(value, str):
        return parse_duration(value, name=name)
    text = value.strip()
    if re.fullmatch(r"P[^T]*[YM].*", text.upper()):
        raise InvalidDeadline(
            f"{name}: years and months have no fixed length; write days or weeks "
            f"(P30D, P4W), got {shown(value)}"
        )
    seconds = _seconds_of(text.lower(), text.upper())
    if seconds is None:
        raise InvalidDeadline(f"{name} must be {_FORMS}, got {shown(value)}")
    if seconds <= 0:
        raise InvalidDeadline(f"{name} must be more than zero seconds, got {shown(value)}")
    if not math.isfinite(seconds) or seconds > LONGEST.total_seconds():  # inf: 400 digits
        raise InvalidDeadline(too_long(name, shown(value)))
    return parse_duration(seconds, name=name)  # (and no positive one rounds to zero)


def _seconds_of(lower: str, upper: str) -> float | None:
    if re.fullmatch(_NUMBER, lower):
        return float(lower)
    if _SHORT.fullmatch(lower):
        return sum(float(n) * _UNITS[unit] for n, unit in _SHORT_PART.findall(lower))
    iso = _ISO.fullmatch(upper)
    if iso is None or upper in {"P", "PT"} or upper.endswith("T"):
        return None
    return sum(float(iso[unit]) * _UNITS[unit] for unit in "wdhms" if iso[unit] is not None)


def parse_retention(value: object, *, name: str) -> timedelta | None:
    """The ``deadlines_retention`` setting: seconds or a timedelta; ``None`` or zero turn
    the workers' periodic purge off (``None`` is returned for both)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
        return None
    if isinstance(value, timedelta) and value == timedelta(0):
        return None
    return parse_duration(value, name=name)


def parse_batch_size(value: object, *, name: str) -> int:
    """A batch size: a whole number from 1 to :data:`MAX_BATCH_SIZE` (text allowed)."""
    number = value
    # ASCII digits only: str.isdigit() is true of "¹", which int() refuses
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
        with contextlib.suppress(ValueError):  # past int()'s 4,300 digits: too large too
            number = int(value.strip())
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_BATCH_SIZE:
        raise InvalidDeadline(
            f"{name} must be a whole number from 1 to {MAX_BATCH_SIZE}, got {shown(value)}"
        )
    return number


def cutoff(now: datetime, older_than: timedelta) -> datetime:
    """The instant before which a run must have ended to be purged: ``now - older_than``.

    ``now`` is the database clock, read once per purge (every batch and the dry run use
    the same cutoff)."""
    parse_instant(now, name="now")
    if older_than <= timedelta(0):
        raise InvalidDeadline(f"older_than must be more than zero, got {older_than}")
    return now - older_than


def purge_due(
    last: float | None, now: float, *, behind: bool, interval: timedelta = PURGE_INTERVAL
) -> bool:
    """Does a reconcile pass purge now? Its first pass does; then once per ``interval``
    (``last`` and ``now`` are monotonic readings), or at once when the last pass stopped
    at :data:`MAX_BATCHES_PER_PASS` with more to purge (``behind``)."""
    if last is None or behind:
        return True
    return now - last >= interval.total_seconds()


@dataclass(frozen=True, slots=True)
class PurgeCounts:
    """What a purge deleted (or, on a dry run, would delete).

    ``kept``: ended runs older than the cutoff kept because an effect of theirs could
    still be asked for (counted by a dry run only). ``more``: the purge stopped at its
    batch bound and more runs are due.
    """

    runs: int = 0
    events: int = 0
    effects: int = 0
    plans: int = 0
    batches: int = 0
    kept: int = 0
    more: bool = False

    def __add__(self, other: PurgeCounts) -> PurgeCounts:
        return PurgeCounts(
            self.runs + other.runs,
            self.events + other.events,
            self.effects + other.effects,
            self.plans + other.plans,
            self.batches + other.batches,
            self.kept + other.kept,
            other.more,
        )

    def stopped(self, more: bool) -> PurgeCounts:
        return replace(self, more=more)

    def describe(self) -> str:
        """``1200 runs (3600 events, 40 effects, 2 plans) in 3 batches``."""
        batches = f"{self.batches} batch" + ("" if self.batches == 1 else "es")
        return (
            f"{self.runs} runs ({self.events} events, {self.effects} effects, "
            f"{self.plans} plans) in {batches}"
        )

    def as_dict(self) -> dict[str, int | bool]:
        return {
            "runs": self.runs,
            "events": self.events,
            "effects": self.effects,
            "plans": self.plans,
            "batches": self.batches,
            "kept": self.kept,
            "more": self.more,
        }


def describe_age(age: timedelta) -> str:
    """``14 days``, ``36 hours``, ``90 minutes``, ``45 seconds``: an age for a log line."""
    seconds = age.total_seconds()
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}" + ("" if count == 1 else "s")
    return f"{seconds:g} seconds"
