"""Pure rules for where a deadline comes from. No Celery, no settings, no clock reads.

Precedence (first level that says anything wins)::

    call option  >  task attribute  >  contract  >  per-task setting  >  default setting
    >  no deadline

At every level :data:`UNSET` means "ask the next level" and ``None`` means "no
deadline" (so a task can opt out of a project-wide default). A child task can only
shorten the deadline it inherits (Go's ``context.WithDeadline``): :func:`govern`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal, NamedTuple, TypeAlias

from ..errors import InvalidDeadline
from .quoting import shown


class _Unset(enum.Enum):
    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


#: "Not said at this level; ask the next one."
UNSET: Final = _Unset.UNSET
Unset: TypeAlias = Literal[_Unset.UNSET]

#: A duration as users may write it: seconds or a timedelta.
DurationLike: TypeAlias = int | float | timedelta

Source = Literal["call", "task", "setting", "default", "scope", "parent", "expires"]


#: The longest duration this package reads: a century. Anything longer is a unit or
#: clock error, and every instant of this millennium plus it stays inside datetime's range.
LONGEST: Final = timedelta(days=36525)

#: The shortest duration above zero: a timedelta holds whole microseconds, and a shorter
#: positive value would silently become zero.
SHORTEST: Final = timedelta(microseconds=1)


def parse_duration(value: object, *, name: str, allow_zero: bool = False) -> timedelta:
    """Seconds (int or float) or a timedelta, as a timedelta; raise :class:`InvalidDeadline`.

    Booleans, NaN, infinities, negative values, values longer than :data:`LONGEST` and
    positive values shorter than a microsecond (they would round to zero) are refused,
    and so is zero unless ``allow_zero`` (a reserve may be zero, a budget may not).
    ``name`` is what the error message calls the value.
    """
    if isinstance(value, timedelta):
        duration = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidDeadline(f"{name} must be finite, got {shown(value)}")
        seconds = _seconds(value)  # an int too large for a float: an infinity, too long
        if seconds > LONGEST.total_seconds():
            raise InvalidDeadline(too_long(name, shown(value)))
        # any negative value, however small, is refused below (it must not round to zero)
        duration = timedelta(seconds=seconds) if seconds >= 0 else -SHORTEST
        if seconds > 0 and duration < SHORTEST:
            raise InvalidDeadline(
                f"{name} of {shown(value)} s is shorter than a microsecond and would be zero"
            )
    else:
        raise InvalidDeadline(
            f"{name} must be a number of seconds or a timedelta, got {type(value).__name__} "
            f"{shown(value)}"
        )
    if duration < timedelta(0) or (duration == timedelta(0) and not allow_zero):
        bound = "zero or more" if allow_zero else "more than zero"
        raise InvalidDeadline(f"{name} must be {bound} seconds, got {shown(value)}")
    if duration > LONGEST:
        raise InvalidDeadline(too_long(name, shown(value)))
    return duration


def too_long(name: str, shown_value: str) -> str:
    """What a duration longer than :data:`LONGEST` is told."""
    return f"{name} is too long: at most {LONGEST.days} days (a century), got {shown_value}"


def _seconds(value: int | float) -> float:
    """``value`` as a float; an int too large for one is an infinity of its sign."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def capped_seconds(value: float) -> timedelta | None:
    """A count of seconds a caller gave Celery (a ``countdown``, an ``expires``, a time
    limit) as a timedelta, its size capped at :data:`LONGEST` (a wait that long is later
    than any deadline, and no sum with it overflows); ``None`` for NaN."""
    seconds = _seconds(value)
    if math.isnan(seconds):
        return None
    limit = LONGEST.total_seconds()
    return timedelta(seconds=max(-limit, min(seconds, limit)))


def parse_budget(value: object, *, name: str, maximum: timedelta) -> timedelta | None:
    """A budget (``None`` = no deadline), refusing one longer than ``maximum``."""
    if value is None:
        return None
    budget = parse_duration(value, name=name)
    if budget > maximum:
        raise InvalidDeadline(
            f"{name} of {budget} is longer than the maximum budget {maximum} "
            "(setting deadlines_max_budget)"
        )
    return budget


def parse_instant(value: object, *, name: str) -> datetime:
    """An aware datetime, or :class:`InvalidDeadline` (naive datetimes are refused)."""
    if not isinstance(value, datetime):
        raise InvalidDeadline(f"{name} must be an aware datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidDeadline(
            f"{name} must be timezone-aware, got the naive datetime {value.isoformat()}"
        )
    return value


class Governed(NamedTuple):
    """The deadline a message will carry, and whether an inherited one cut it short."""

    deadline: datetime | None
    source: Source | None
    clamped_from: datetime | None = None


def govern(
    own: datetime | None,
    own_source: Source | None,
    inherited: datetime | None,
    inherited_source: Source,
) -> Governed:
    """Combine a task's own deadline with the one it inherits: the earlier one wins.

    An own deadline later than the inherited one is clamped to it and the original is
    reported in ``clamped_from`` so the caller can make the clamp visible.
    """
    if inherited is None:
        return Governed(own, own_source if own is not None else None)
    if own is None:
        return Governed(inherited, inherited_source)
    if own > inherited:
        return Governed(inherited, inherited_source, clamped_from=own)
    return Governed(own, own_source)


@dataclass(frozen=True, slots=True)
class Anchor:
    """An attempt's budget, anchored once on the monotonic clock when the attempt starts.

    The wall clock is read exactly once (``started_at``) to turn the absolute deadline
    into ``budget_at_start``; after that only monotonic readings are used, so a wall
    clock jump during the attempt neither adds nor removes time.
    """

    deadline: datetime
    started_at: datetime
    started_monotonic: float
    budget_at_start: timedelta

    @classmethod
    def at(cls, deadline: datetime, now: datetime, monotonic: float) -> Anchor:
        return cls(deadline, now, monotonic, deadline - now)

    def remaining(self, monotonic: float) -> timedelta:
        """Budget left at the monotonic reading ``monotonic`` (negative once overrun)."""
        return self.budget_at_start - timedelta(seconds=monotonic - self.started_monotonic)

    def deadline_monotonic(self) -> float:
        """The monotonic reading at which the deadline passes."""
        return self.started_monotonic + self.budget_at_start.total_seconds()
