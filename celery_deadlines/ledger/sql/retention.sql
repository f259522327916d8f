-- The purge's statements (celery_deadlines.ledger.sql.retention, whose docstring states
-- the rule). A run goes when it ended (its status in {terminal}), its last write is
-- before the cutoff, and none of its effects could still be asked for: none unresolved,
-- none changed at or after the cutoff, none asked for at or after it. Each statement
-- under its name; the format and the slots in braces:
-- celery_deadlines/ledger/sql/statements.py. The condition on the effects is written in
-- each statement that selects runs; their golden files (tests/golden/sql/retention.*)
-- show them side by side.

-- preview --
-- What a purge with the cutoff would delete now, and the ended runs older than it kept
-- for their effects: runs, kept, effects, events, plans (a dry run: nothing is written).
WITH ended AS (
    SELECT r.id, EXISTS (SELECT 1 FROM celery_deadlines_effect e WHERE e.run_id = r.id
                         AND (e.state IN {unresolved} OR e.updated_at >= %(cutoff)s
                              OR e.asked_at >= %(cutoff)s)) AS kept
    FROM celery_deadlines_run r
    WHERE r.status IN {terminal} AND r.updated_at < %(cutoff)s
)
SELECT (SELECT count(*) FROM ended WHERE NOT kept),
       (SELECT count(*) FROM ended WHERE kept),
       (SELECT count(*) FROM celery_deadlines_effect
        WHERE run_id IN (SELECT id FROM ended WHERE NOT kept)),
       (SELECT count(*) FROM celery_deadlines_runevent
        WHERE run_id IN (SELECT id FROM ended WHERE NOT kept)),
       (SELECT count(*) FROM celery_deadlines_runplan
        WHERE run_id IN (SELECT id FROM ended WHERE NOT kept))

-- select_batch (postgresql) --
-- Up to %(limit)s purgeable runs (id, updated_at), oldest first, through the partial index
-- of ended runs (cdl_run_ended_idx: its condition, verbatim, leads the WHERE); locked,
-- skipping the ones another purge holds.
SELECT r.id, r.updated_at FROM celery_deadlines_run r
WHERE r.status IN {terminal} AND r.updated_at < %(cutoff)s
  AND NOT EXISTS (SELECT 1 FROM celery_deadlines_effect e WHERE e.run_id = r.id
                  AND (e.state IN {unresolved} OR e.updated_at >= %(cutoff)s
                       OR e.asked_at >= %(cutoff)s))
ORDER BY r.updated_at LIMIT %(limit)s FOR UPDATE OF r SKIP LOCKED

-- select_batch (sqlite) --
-- As PostgreSQL's, without locks (SQLite serialises writers). The index is named: without
-- statistics (no ANALYZE) SQLite would rather read every ended run by the status index
-- and sort them. The stored text of updated_at itself is returned (a datetime read back
-- and written again may be spelled otherwise, and text compares by its spelling).
SELECT r.id, CAST(r.updated_at AS TEXT) FROM celery_deadlines_run r INDEXED BY cdl_run_ended_idx
WHERE r.status IN {terminal} AND r.updated_at < %(cutoff)s
  AND NOT EXISTS (SELECT 1 FROM celery_deadlines_effect e WHERE e.run_id = r.id
                  AND (e.state IN {unresolved} OR e.updated_at >= %(cutoff)s
                       OR e.asked_at >= %(cutoff)s))
ORDER BY r.updated_at LIMIT %(limit)s

-- select_batch_after (postgresql) --
-- As select_batch, from %(after)s on, where the last batch stopped (runs kept for their
-- effects, and the index entries of runs deleted but not vacuumed yet, are not read
-- again by every batch).
SELECT r.id, r.updated_at FROM celery_deadlines_run r
WHERE r.status IN {terminal} AND r.updated_at < %(cutoff)s AND r.updated_at >= %(after)s
  AND NOT EXISTS (SELECT 1 FROM celery_deadlines_effect e WHERE e.run_id = r.id
                  AND (e.state IN {unresolved} OR e.updated_at >= %(cutoff)s
                       OR e.asked_at >= %(cutoff)s))
ORDER BY r.updated_at LIMIT %(limit)s FOR UPDATE OF r SKIP LOCKED

-- select_batch_after (sqlite) --
SELECT r.id, CAST(r.updated_at AS TEXT) FROM celery_deadlines_run r INDEXED BY cdl_run_ended_idx
WHERE r.status IN {terminal} AND r.updated_at < %(cutoff)s AND r.updated_at >= %(after)s
  AND NOT EXISTS (SELECT 1 FROM celery_deadlines_effect e WHERE e.run_id = r.id
                  AND (e.state IN {unresolved} OR e.updated_at >= %(cutoff)s
                       OR e.asked_at >= %(cutoff)s))
ORDER BY r.updated_at LIMIT %(limit)s

-- take_write_lock (sqlite) --
-- A batch's first statement on SQLite: it takes the write lock, so that the selection
-- that follows is what the deletes see.
DELETE FROM celery_deadlines_runplan WHERE 1 = 0

-- lock_effects (postgresql) --
-- The effects of the selected runs, locked before they are looked at again.
SELECT 1 FROM celery_deadlines_effect WHERE run_id {in_values:ids} FOR UPDATE

-- askable --
-- Which of the selected runs have an effect whose key could still be asked for: they are
-- kept.
SELECT DISTINCT e.run_id FROM celery_deadlines_effect e WHERE e.run_id {in_values:ids}
  AND (e.state IN {unresolved} OR e.updated_at >= %(cutoff)s OR e.asked_at >= %(cutoff)s)

-- delete_effects --
-- A batch's deletes, children first (the effects' and plans' references are checked at
-- commit; an event's run is not, on PostgreSQL: {run_kept} keeps a run while an event is
-- written for it from a statement's snapshot).
DELETE FROM celery_deadlines_effect WHERE run_id {in_values:ids}

-- delete_events --
DELETE FROM celery_deadlines_runevent WHERE run_id {in_values:ids}

-- delete_plans --
DELETE FROM celery_deadlines_runplan WHERE run_id {in_values:ids}

-- delete_runs --
DELETE FROM celery_deadlines_run WHERE id {in_values:ids} AND status IN {terminal}
