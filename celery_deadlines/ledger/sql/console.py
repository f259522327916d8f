"""The operator console's reads at any size (the admin): what a list's filter offers.

A filter lists the values a column holds (the task names, queues and reasons of the
runs, the names of the effects). ``SELECT DISTINCT`` reads every row for that; here
each value is found by one probe of the column's index (a loose index scan: the
smallest value, then the smallest above it, and so on), so listing twenty task names
costs twenty probes whether the ledger holds ten thousand runs or ten million
(migration 0010 made the indexes; ``tests/django/admin/test_listing_query_plans.py`` holds the
plans). Read-only: the console writes only through :mod:`..operations`.
"""

from __future__ import annotations

from typing import Final

from .statements import Sql, Statements

#: The most values a filter lists (each is one index probe); past it, the list says so.
MOST_VALUES: Final = 500

_LOOSE_SCAN = """
    WITH RECURSIVE seen(value) AS (
        SELECT MIN({column}) FROM {table} WHERE {listed}
        UNION ALL
        SELECT (SELECT MIN({column}) FROM {table} WHERE {column} > seen.value AND {listed})
        FROM seen WHERE seen.value IS NOT NULL
    )
    SELECT value FROM seen WHERE value IS NOT NULL LIMIT %s
"""
#: The runs' task names (``cdl_run_task_name_idx``).
TASK_NAMES: Final = Sql(
    "console.task_names",
    _LOOSE_SCAN,
    table="{run}",
    column="task_name",
    listed="task_name IS NOT NULL",
)
#: The queues runs were routed to (``cdl_run_queue_idx``).
QUEUES: Final = Sql(
    "console.queues", _LOOSE_SCAN, table="{run}", column="queue", listed="queue IS NOT NULL"
)
#: Whether a run's queue is not recorded (runs from before migration 0008).
QUEUE_UNRECORDED: Final = Sql(
    "console.queue_unrecorded", "SELECT 1 FROM {run} WHERE queue IS NULL LIMIT 1"
)
#: The reasons runs ended or wait with (``cdl_run_reason_idx``, partial: its condition
#: is in each probe, or the index could not serve the probe).
REASONS: Final = Sql(
    "console.reasons", _LOOSE_SCAN, table="{run}", column="reason", listed="reason <> ''"
)
#: The effects' names (``cdl_effect_name_idx``).
EFFECT_NAMES: Final = Sql(
    "console.effect_names",
    _LOOSE_SCAN,
    table="{effect}",
    column="name",
    listed="name IS NOT NULL",
)


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
