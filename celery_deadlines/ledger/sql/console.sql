-- The admin's reads at any size (celery_deadlines.ledger.sql.console): a filter's values
-- by a loose index scan, one index probe a value. Each statement under its name; the
-- format and the slots in braces: celery_deadlines/ledger/sql/statements.py.

-- task_names --
-- The runs' task names (cdl_run_task_name_idx).
WITH RECURSIVE seen(value) AS (
    SELECT MIN(task_name) FROM celery_deadlines_run WHERE task_name IS NOT NULL
    UNION ALL
    SELECT (SELECT MIN(task_name) FROM celery_deadlines_run WHERE task_name > seen.value AND task_name IS NOT NULL)
    FROM seen WHERE seen.value IS NOT NULL
)
SELECT value FROM seen WHERE value IS NOT NULL LIMIT %s

-- queues --
-- The queues runs were routed to (cdl_run_queue_idx).
WITH RECURSIVE seen(value) AS (
    SELECT MIN(queue) FROM celery_deadlines_run WHERE queue IS NOT NULL
    UNION ALL
    SELECT (SELECT MIN(queue) FROM celery_deadlines_run WHERE queue > seen.value AND queue IS NOT NULL)
    FROM seen WHERE seen.value IS NOT NULL
)
SELECT value FROM seen WHERE value IS NOT NULL LIMIT %s

-- queue_unrecorded --
-- Whether a run's queue is not recorded (runs from before migration 0008).
SELECT 1 FROM celery_deadlines_run WHERE queue IS NULL LIMIT 1

-- reasons --
-- The reasons runs ended or wait with (cdl_run_reason_idx, partial: its condition is in
-- each probe, or the index could not serve the probe).
WITH RECURSIVE seen(value) AS (
    SELECT MIN(reason) FROM celery_deadlines_run WHERE reason <> ''
    UNION ALL
    SELECT (SELECT MIN(reason) FROM celery_deadlines_run WHERE reason > seen.value AND reason <> '')
    FROM seen WHERE seen.value IS NOT NULL
)
SELECT value FROM seen WHERE value IS NOT NULL LIMIT %s

-- effect_names --
-- The effects' names (cdl_effect_name_idx).
WITH RECURSIVE seen(value) AS (
    SELECT MIN(name) FROM celery_deadlines_effect WHERE name IS NOT NULL
    UNION ALL
    SELECT (SELECT MIN(name) FROM celery_deadlines_effect WHERE name > seen.value AND name IS NOT NULL)
    FROM seen WHERE seen.value IS NOT NULL
)
SELECT value FROM seen WHERE value IS NOT NULL LIMIT %s
