"""The database clock and the few expressions that differ between databases.

The ledger's decisions are comparisons against *one* clock, the database's, evaluated
inside the statement that acts on them. PostgreSQL's ``clock_timestamp()`` is read at
each call (``now()`` would be frozen at the start of the transaction). SQLite's
``'now'`` is the time of the current statement, which is what a single-statement
compare-and-swap needs.

Every statement is written with ``%s`` placeholders (Django's cursor turns them into
SQLite's ``?``), so a literal ``%`` is written ``%%``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils.dateparse import parse_datetime

from ...errors import ConfigurationError

SUPPORTED = ("postgresql", "sqlite")


@dataclass(frozen=True)
class Dialect:
    """SQL fragments for one database vendor."""

    vendor: str
    #: The database clock, as an SQL expression.
    now: str
    #: ``now + %s``: the database clock plus a duration parameter (see :attr:`seconds`).
    now_plus: str
    #: ``LEAST(a, b)`` where ``b`` may be NULL (then ``a``).
    least_template: str
    #: A placeholder for a JSON document given as text.
    json_param: str = "%s"
    #: Appended to a SELECT that fences a write on the run row: lock it until the
    #: statement commits (PostgreSQL); SQLite serialises writers anyway.
    lock_rows: str = ""
    #: Appended to a SELECT of the run row whose id an event is written with: keep the
    #: row from being deleted until the statement commits (PostgreSQL, which does not
    #: check an event's run: migration 0012); SQLite checks it, and serialises writers.
    key_share: str = ""
    #: ``IN`` the values of one parameter (a list: :meth:`values`), as a condition's
    #: right-hand side (PostgreSQL: ``= ANY`` an array).
    in_values: str = "= ANY(%s)"
    #: The parameter :attr:`now_plus` takes for a duration (PostgreSQL: seconds, a
    #: float): a function of the dialect's own, not a method, as it runs at every claim.
    seconds: Callable[[timedelta], Any] = timedelta.total_seconds

    def least(self, first: str, nullable: str) -> str:
        return self.least_template.format(first=first, nullable=nullable)

    def instant(self, value: Any) -> datetime | None:
        """A timestamp read back from this database, as an aware UTC datetime."""
        if value is None:
            return None
        if isinstance(value, datetime):
            zone = value.tzinfo
            if zone is UTC:
                return value
            return value.astimezone(UTC) if zone else value.replace(tzinfo=UTC)
        parsed = parse_datetime(str(value))
        if parsed is None:
            raise ValueError(f"not a timestamp: {value!r}")
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)

    def values(self, values: Iterable[int | str]) -> Any:
        """A list of values as :attr:`in_values` takes it (SQLite: a JSON array)."""
        if self.vendor == "sqlite":
            return json.dumps(list(values))
        return list(values)

    def param(self, value: datetime | None) -> Any:
        """An aware datetime as this database stores it (SQLite: naive UTC text)."""
        if value is None or self.vendor != "sqlite":
            return value
        return value.astimezone(UTC).replace(tzinfo=None).isoformat(" ")


POSTGRESQL = Dialect(
    vendor="postgresql",
    now="clock_timestamp()",
    now_plus="(clock_timestamp() + make_interval(secs => %s))",
    least_template="LEAST({first}, {nullable})",
    json_param="CAST(%s AS jsonb)",
    lock_rows=" FOR UPDATE",
    key_share=" FOR KEY SHARE",
)
_SQLITE_NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"


def _sqlite_seconds(duration: timedelta) -> str:
    """A duration as SQLite's ``strftime`` takes it: a modifier, ``+1.500000 seconds``."""
    return f"{duration.total_seconds():+.6f} seconds"


SQLITE = Dialect(
    vendor="sqlite",
    seconds=_sqlite_seconds,
    now=_SQLITE_NOW,
    now_plus="strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)",
    least_template="MIN({first}, COALESCE({nullable}, '9999-12-31 23:59:59'))",
    in_values="IN (SELECT value FROM json_each(%s))",
)


def dialect_for(vendor: str) -> Dialect:
    """The dialect of a Django connection's ``vendor``, or :class:`ConfigurationError`."""
    if vendor == "postgresql":
        return POSTGRESQL
    if vendor == "sqlite":
        return SQLITE
    raise ConfigurationError(
        f"the run ledger supports {' and '.join(SUPPORTED)}, not {vendor} "
        "(setting deadlines_database, Django: CELERY_DEADLINES_DATABASE)"
    )
