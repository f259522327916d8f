"""The purge of ended runs: the workers' periodic pass and ``manage.py deadlines purge``.

A run goes, with its events, effects and plans, only when all of these hold (the rule
is drawn in docs/explanation/run-ledger.md, "Retention"):

1. it ended: SUCCEEDED, FAILED or EXPIRED (never QUEUED, RETRYING, RUNNING, UNKNOWN,
   PAUSED or CLOCK_UNCERTAIN);
2. its last write (``updated_at``, by the database clock) is before the cutoff;
3. none of its effects could still be asked for (:data:`ASKABLE`): none is unresolved
   (DISPATCHED or UNKNOWN: it waits for a reconciler, an operator or the late outcome
   of the attempt that dispatched it), none changed at or after the cutoff, and no
   attempt of any run found its key at or after the cutoff (``asked_at``: a duplicate
   run that was replayed its outcome may ask again).

An effect goes only with its run, and a run only with all of its effects.

A batch is one transaction: select up to ``limit`` such runs, oldest first, through the
partial index ``cdl_run_ended_idx`` (no scan of the run table); lock them and their
effects, look at the effects again, delete the children, then the runs. PostgreSQL locks
rows (``FOR UPDATE``; ``SKIP LOCKED``, so that several workers purging at once share
the work): an operator's requeue of an old FAILED run or a duplicate asking for a key
waits for the batch, and a key asked for between the selection and the lock keeps its
run. SQLite serialises writers: the batch takes the write lock with its first statement,
so nothing changes between the selection and the deletes.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final, NamedTuple

from ...rules.retention import PurgeCounts
from .predicates import EFFECT, EVENT, PLAN, RUN, TERMINAL_SQL, UNRESOLVED_SQL
from .statements import Statements

#: The partial index of ended runs by their last write (migration 0007).
ENDED_INDEX: Final = "cdl_run_ended_idx"
#: An ended run older than the cutoff (the partial index's own condition, verbatim).
ENDED_BEFORE: Final = f"r.status IN {TERMINAL_SQL} AND r.updated_at < %(cutoff)s"
#: An effect ``e`` whose key could still be asked for: it keeps its run (and itself).
ASKABLE: Final = (
    f"(e.state IN {UNRESOLVED_SQL} OR e.updated_at >= %(cutoff)s OR e.asked_at >= %(cutoff)s)"
)
#: The run ``r`` has an effect whose key could still be asked for.
KEEPS: Final = f"EXISTS (SELECT 1 FROM {EFFECT} e WHERE e.run_id = r.id AND {ASKABLE})"
#: What one batch deletes, children first (the effects' and plans' references are checked
#: at commit; an event's run is not, on PostgreSQL: ``{run_kept}`` keeps a run while an
#: event is written for it from a statement's snapshot).
CHILDREN: Final = (("effects", EFFECT), ("events", EVENT), ("plans", PLAN))


class Batch(NamedTuple):
    """What one batch did: ``selected`` runs (fewer than the limit: none left but those
    another purge holds), the ``counts`` deleted, and the ``last`` run's ``updated_at``
    as the database returned it (where the next batch starts)."""

    selected: int
    counts: PurgeCounts
    last: Any


class Retention(Statements):
    """The purge's statements: a dry run's counts, one batch, and their query plans."""

    def select_sql(self, *, lock: bool, after: bool = False) -> str:
        """Up to ``%(limit)s`` purgeable runs (``id, updated_at``), oldest first.
        ``lock``: PostgreSQL locks them and skips the ones another purge holds.
        ``after``: only from ``%(after)s`` on, where the last batch stopped (runs kept
        for their effects, and the index entries of runs deleted but not vacuumed yet,
        are not read again by every batch)."""
        sqlite = self.dialect.vendor == "sqlite"
        # SQLite without statistics (no ANALYZE) would rather read every ended run by
        # the status index and sort them: name the index (PostgreSQL's planner picks it)
        hint = f" INDEXED BY {ENDED_INDEX}" if sqlite else ""
        since = " AND r.updated_at >= %(after)s" if after else ""
        locking = " FOR UPDATE OF r SKIP LOCKED" if lock and not sqlite else ""
        # SQLite: the stored text itself (a datetime read back and written again may be
        # spelled otherwise, and text compares by its spelling)
        last = "CAST(r.updated_at AS TEXT)" if sqlite else "r.updated_at"
        return (
            f"SELECT r.id, {last} FROM {RUN} r{hint} WHERE {ENDED_BEFORE}{since} "
            f"AND NOT {KEEPS} ORDER BY r.updated_at LIMIT %(limit)s{locking}"
        )

    def delete_sql(self, ids: Sequence[int]) -> list[tuple[str, str]]:
        """``(what, statement)``: the deletes of a batch of run ids, children first."""
        listed = _listed(ids)
        deletes = [
            (what, f"DELETE FROM {table} WHERE run_id IN {listed}") for what, table in CHILDREN
        ]
        deletes.append(
            ("runs", f"DELETE FROM {RUN} WHERE id IN {listed} AND status IN {TERMINAL_SQL}")
        )
        return deletes

    def preview(self, cutoff: datetime) -> PurgeCounts:
        """What a purge with ``cutoff`` would delete now (a dry run: nothing is written),
        and how many ended runs older than it are kept for their effects."""
        purgeable = f"SELECT r.id FROM {RUN} r WHERE {ENDED_BEFORE} AND NOT {KEEPS}"
        children = ", ".join(
            f"(SELECT count(*) FROM {table} WHERE run_id IN ({purgeable}))" for _, table in CHILDREN
        )
        _, rows = self.execute(
            f"""
            SELECT (SELECT count(*) FROM {RUN} r WHERE {ENDED_BEFORE} AND NOT {KEEPS}),
                   (SELECT count(*) FROM {RUN} r WHERE {ENDED_BEFORE} AND {KEEPS}),
                   {children}
            """,
            {"cutoff": self.dialect.param(cutoff)},
        )
        runs, kept, effects, events, plans = (int(n) for n in rows[0])
        return PurgeCounts(runs=runs, events=events, effects=effects, plans=plans, kept=kept)

    def purge_batch(self, cutoff: datetime, limit: int, after: Any = None) -> Batch:
        """Delete up to ``limit`` purgeable runs with their children, in one transaction
        (from ``after`` on: the last batch's :attr:`Batch.last`)."""
        d = self.dialect
        params = {"cutoff": d.param(cutoff), "limit": limit, "after": after}
        with self.store.transaction():
            if d.vendor == "sqlite":
                # the write lock first: the selection below is then what the deletes see
                self.execute(f"DELETE FROM {PLAN} WHERE 1 = 0", [])
            _, rows = self.execute(self.select_sql(lock=True, after=after is not None), params)
            if not rows:
                return Batch(0, PurgeCounts(), after)
            ids = [int(row[0]) for row in rows]
            listed = _listed(ids)
            if d.vendor != "sqlite":  # lock their effects, then look at them again
                self.execute(f"SELECT 1 FROM {EFFECT} WHERE run_id IN {listed} FOR UPDATE", [])
            _, kept = self.execute(
                f"SELECT DISTINCT e.run_id FROM {EFFECT} e WHERE e.run_id IN {listed} "
                f"AND {ASKABLE}",
                {"cutoff": params["cutoff"]},
            )
            keep = {int(row[0]) for row in kept}
            purged = [run_id for run_id in ids if run_id not in keep]
            counts = dict.fromkeys(("runs", "events", "effects", "plans"), 0)
            for what, sql in self.delete_sql(purged) if purged else []:
                counts[what], _ = self.execute(sql, [])
            if counts["runs"] != len(purged):  # locked or written under the lock: never
                raise RuntimeError(
                    f"purge: {len(purged)} runs selected, {counts['runs']} deleted; rolled back"
                )
        deleted = PurgeCounts(
            runs=counts["runs"],
            events=counts["events"],
            effects=counts["effects"],
            plans=counts["plans"],
            batches=1 if purged else 0,
        )
        return Batch(len(ids), deleted, rows[-1][1])  # the value as stored: exact

    def plans(
        self, cutoff: datetime, limit: int, ids: Sequence[int], after: Any = None
    ) -> dict[str, list[str]]:
        """The database's plan of each statement of a batch (nothing is run):
        ``EXPLAIN`` on PostgreSQL, ``EXPLAIN QUERY PLAN`` on SQLite."""
        d = self.dialect
        explain = "EXPLAIN QUERY PLAN " if d.vendor == "sqlite" else "EXPLAIN "
        params = {"cutoff": d.param(cutoff), "limit": limit, "after": after}
        select = self.select_sql(lock=True, after=after is not None)
        found = {}
        for what, sql in [("select", select), *self.delete_sql(ids)]:
            _, rows = self.execute(explain + sql, params if what == "select" else [])
            found[what] = [str(row[-1]) for row in rows]
        return found


def _listed(ids: Sequence[int]) -> str:
    """``(1, 2, 3)``: run ids (integers read from the ledger) as an SQL list."""
    return "(" + ", ".join(str(int(run_id)) for run_id in ids) + ")"
