"""The database cap: how long a body's next statement may run, from the time left (pure).

A DeadlineTask body's statements end by the run's deadline
(:mod:`celery_deadlines.core.database` applies this to Django's connections). What is
decided here, with monotonic readings as plain floats and no clock, Django or database:

* the setting (``deadlines_database_cap``): ``True`` (every alias), ``False`` (none), or
  the aliases to cap (:func:`parse_cap`);
* the timeout a statement is given (:func:`timeout_ms`): the time left minus a
  headroom, in whole milliseconds, rounded down; ``None`` when less than a millisecond
  would be left (a timeout of 0 is PostgreSQL's "no timeout": the statement is not sent);
* whether a timeout sent earlier still holds for a statement starting now
  (:func:`holds`): a timeout ``v`` sent at ``t`` lets a statement starting at ``s`` run
  until ``s + v``, which is by the deadline while ``s <= deadline - v``. The headroom
  (:func:`headroom`: a tenth of the time left, at most a second) is what lets the next
  statements run under the timeout already sent: at most one setting per headroom is
  sent, and a statement is cut at most that much before the deadline;
* whether a statement's error was the cap's (:func:`cut_by_cap`): it ran as long as
  the timeout it was given (an earlier cut is the server's own timeout, or ``NOWAIT``);
* what the error says (:func:`cut_detail`): the statement's first characters, cut as
  :func:`~celery_deadlines.rules.quoting.shown` cuts any value from outside.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Final

from ..errors import InvalidDeadline
from .quoting import shown

#: The headroom is this fraction of the time left when a timeout is sent...
HEADROOM_FRACTION: Final = 0.1
#: ...and at most this many seconds: one setting a second at most, however long the budget.
MOST_HEADROOM: Final = 1.0
#: Timer and rounding slack when judging whether a statement ran as long as its timeout
#: (the server counts from when it received the statement, after the client sent it).
CUT_SLACK: Final = 0.002
#: The most characters of a statement a cut's message repeats.
STATEMENT_SHOWN: Final = 80


def parse_cap(value: object, *, name: str) -> bool | frozenset[str]:
    """``deadlines_database_cap``: ``True`` (every alias), ``False`` (none), or a list,
    tuple or set of alias names (those only; an empty one caps none)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        aliases = list(value)
        for alias in aliases:
            if not isinstance(alias, str) or not alias:
                raise InvalidDeadline(
                    f"{name} must be True, False or a list of database aliases; "
                    f"{shown(alias)} is not an alias"
                )
        return frozenset(aliases)
    raise InvalidDeadline(
        f"{name} must be True, False or a list of database aliases, got {shown(value)}"
    )


def capped(setting: bool | frozenset[str], alias: str) -> bool:
    """Whether the setting caps the statements of ``alias``."""
    return setting if isinstance(setting, bool) else alias in setting


def chosen(setting: bool | frozenset[str], aliases: Collection[str]) -> tuple[str, ...]:
    """The aliases of ``aliases`` the setting caps, in their order."""
    return tuple(alias for alias in aliases if capped(setting, alias))


def headroom(remaining: float) -> float:
    """Seconds a timeout sent with ``remaining`` left keeps before the deadline."""
    return min(max(remaining, 0.0) * HEADROOM_FRACTION, MOST_HEADROOM)


def timeout_ms(remaining: float) -> int | None:
    """The timeout (whole milliseconds, rounded down) a statement starting with
    ``remaining`` seconds left is given: the time left minus its :func:`headroom`;
    ``None`` when that is under a millisecond: the statement is not sent."""
    if not remaining > 0:  # NaN too
        return None
    ms = math.floor((remaining - headroom(remaining)) * 1000)
    return ms if ms >= 1 else None


def last_start(timeout: int, deadline: float) -> float:
    """The latest instant (monotonic seconds) a statement may start under a ``timeout``
    (milliseconds) sent earlier and still end by ``deadline``: the wrapper keeps it, and
    compares each statement's start with it (one comparison a statement)."""
    return deadline - timeout / 1000


def holds(timeout: int, now: float, deadline: float) -> bool:
    """Whether a statement starting at ``now`` (monotonic seconds) under a ``timeout``
    (milliseconds) sent earlier ends by ``deadline`` (monotonic seconds)."""
    return now <= last_start(timeout, deadline)


def cut_by_cap(timeout: int, elapsed: float) -> bool:
    """Whether a statement that failed with a timeout's error after ``elapsed`` seconds
    was cut by the cap's ``timeout`` (milliseconds): it ran at least that long."""
    return elapsed >= timeout / 1000 - CUT_SLACK


def cut_detail(sql: object, alias: str, how: str) -> str:
    """The sentence a cut statement's error says: the statement's first characters, the
    alias, and how it was cut (``how``: "statement_timeout", "interrupted", ...)."""
    return (
        f"the query {shown(sql, STATEMENT_SHOWN)} on database {shown(alias)} was cut by "
        f"the deadline ({how})"
    )
