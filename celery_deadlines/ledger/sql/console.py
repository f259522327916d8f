"""The operator console's reads at any size (the admin): what a list's filter offers.

A filter lists the values a column holds (the task names, queues and reasons of the
runs, the names of the effects). ``SELECT DISTINCT`` reads every row for that; here
each value is found by one probe of the column's index (a loose index scan: the
smallest value, then the smallest above it, and so on), so listing twenty task names
costs twenty probes whether the ledger holds ten thousand runs or ten million
(migration 0010 made the indexes; ``tests/django/admin/test_listing_query_plans.py`` holds the
plans). Read-only: the console writes only through :mod:`..operations`.

Each statement's text is in ``console.sql``, under its name.
"""

from __future__ import annotations

from typing import Final

from .statements import Sql, Statements, queries

#: The most values a filter lists (each is one index probe); past it, the list says so.
MOST_VALUES: Final = 500

_SQL: Final = queries("console")
TASK_NAMES: Final = _SQL["task_names"]
QUEUES: Final = _SQL["queues"]
QUEUE_UNRECORDED: Final = _SQL["queue_unrecorded"]
REASONS: Final = _SQL["reasons"]
EFFECT_NAMES: Final = _SQL["effect_names"]


class Console(Statements):
    """The console's reads, on a :class:`Store`'s connection and dialect."""

    def _values(self, sql: Sql, limit: int) -> list[str]:
        _, rows = self.execute(sql.text[self.dialect.vendor], [limit])
        return [str(row[0]) for row in rows]

    def task_names(self, limit: int = MOST_VALUES) -> list[str]:
        """The runs' task names, in order (at most ``limit``)."""
        return self._values(TASK_NAMES, limit)

    def queues(self, limit: int = MOST_VALUES) -> list[str]:
        """The queues runs were routed to, in order (at most ``limit``)."""
        return self._values(QUEUES, limit)

    def queue_unrecorded(self) -> bool:
        """Whether some run has no recorded queue."""
        _, rows = self.execute(QUEUE_UNRECORDED.text[self.dialect.vendor], [])
        return bool(rows)

    def reasons(self, limit: int = MOST_VALUES) -> list[str]:
        """The reasons of runs that have one, in order (at most ``limit``)."""
        return self._values(REASONS, limit)

    def effect_names(self, limit: int = MOST_VALUES) -> list[str]:
        """The effects' names, in order (at most ``limit``)."""
        return self._values(EFFECT_NAMES, limit)
