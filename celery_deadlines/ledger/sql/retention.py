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

Each statement's text is in ``retention.sql``, under its name.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final, NamedTuple

from ...rules.retention import PurgeCounts
from .statements import Statements, queries

_SQL: Final = queries("retention")
PREVIEW: Final = _SQL["preview"]
SELECT_BATCH: Final = _SQL["select_batch"]
SELECT_BATCH_AFTER: Final = _SQL["select_batch_after"]
TAKE_WRITE_LOCK: Final = _SQL["take_write_lock"]
LOCK_EFFECTS: Final = _SQL["lock_effects"]
ASKABLE: Final = _SQL["askable"]
#: What one batch deletes, children first.
DELETES: Final = (
    ("effects", _SQL["delete_effects"]),
    ("events", _SQL["delete_events"]),
    ("plans", _SQL["delete_plans"]),
    ("runs", _SQL["delete_runs"]),
)


class Batch(NamedTuple):
    """What one batch did: ``selected`` runs (fewer than the limit: none left but those
    another purge holds), the ``counts`` deleted, and the ``last`` run's ``updated_at``
    as the database returned it (where the next batch starts)."""

    selected: int
    counts: PurgeCounts
    last: Any


class Retention(Statements):
    """The purge's statements: a dry run's counts, one batch, and their query plans."""

    def select_sql(self, *, after: bool = False) -> str:
        """Up to ``%(limit)s`` purgeable runs (``id, updated_at``), oldest first, locked
        (PostgreSQL, skipping the ones another purge holds); ``after``: from
        ``%(after)s`` on, where the last batch stopped."""
        return (SELECT_BATCH_AFTER if after else SELECT_BATCH).text[self.dialect.vendor]

    def deletes(self) -> list[tuple[str, str]]:
        """``(what, statement)``: the deletes of a batch, children first; each takes the
        run ids as ``%(ids)s`` (:meth:`~.dialect.Dialect.values`)."""
        vendor = self.dialect.vendor
        return [(what, sql.text[vendor]) for what, sql in DELETES]

    def preview(self, cutoff: datetime) -> PurgeCounts:
        """What a purge with ``cutoff`` would delete now (a dry run: nothing is written),
        and how many ended runs older than it are kept for their effects."""
        d = self.dialect
        _, rows = self.execute(PREVIEW.text[d.vendor], {"cutoff": d.param(cutoff)})
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
                self.execute(TAKE_WRITE_LOCK.text[d.vendor], [])
            _, rows = self.execute(self.select_sql(after=after is not None), params)
            if not rows:
                return Batch(0, PurgeCounts(), after)
            ids = [int(row[0]) for row in rows]
            if d.vendor != "sqlite":  # lock their effects, then look at them again
                self.execute(LOCK_EFFECTS.text[d.vendor], {"ids": d.values(ids)})
            _, kept = self.execute(
                ASKABLE.text[d.vendor], {"ids": d.values(ids), "cutoff": params["cutoff"]}
            )
            keep = {int(row[0]) for row in kept}
            purged = [run_id for run_id in ids if run_id not in keep]
            counts = dict.fromkeys(("runs", "events", "effects", "plans"), 0)
            for what, sql in self.deletes() if purged else []:
                counts[what], _ = self.execute(sql, {"ids": d.values(purged)})
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
        select = self.select_sql(after=after is not None)
        found = {}
        for what, sql in [("select", select), *self.deletes()]:
            given = params if what == "select" else {"ids": d.values(ids)}
            _, rows = self.execute(explain + sql, given)
            found[what] = [str(row[-1]) for row in rows]
        return found
