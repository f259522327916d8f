-- The worker's main process's statements on the attempts of the pool processes it
-- supervises (celery_deadlines.ledger.sql.supervision). Each statement under its name; the
-- format and the slots in braces: celery_deadlines/ledger/sql/statements.py.

-- end_owned --
-- The attempt of a pool process this worker supervises, ended (token + 1); UNKNOWN if one
-- of its effects has no recorded outcome.
UPDATE celery_deadlines_run SET
    status = CASE WHEN {has_unresolved} THEN 'UNKNOWN' ELSE %s END,
    reason = CASE WHEN {has_unresolved} THEN 'effect_unresolved' ELSE %s END,
    detail = %s, lease_token = lease_token + 1, lease_expires_at = NULL,
    version = version + 1, op = 'end_owned', op_detail = %s,
    updated_at = {now}
WHERE task_id = %s AND status = 'RUNNING' AND owner = %s
RETURNING id, status

-- end_owned_effects --
-- Its effects dispatched without an outcome: UNKNOWN (in the same transaction).
UPDATE celery_deadlines_effect SET state = 'UNKNOWN', updated_at = {now},
    error = %s
WHERE run_id = %s AND state = 'DISPATCHED'

-- lapse_owned --
-- The lease of a lost pool process, lapsed now (less the supervisor's grace).
UPDATE celery_deadlines_run SET lease_expires_at = {now_plus}, version = version + 1,
    op = 'worker_lost', op_detail = %s, updated_at = {now}
WHERE task_id = %s AND status = 'RUNNING' AND owner = %s

-- unfinished --
SELECT 1 FROM celery_deadlines_run WHERE task_id = %s AND status NOT IN {terminal}

-- cancelled_running --
-- Of the runs this worker is running (their task ids), those a cancel pulled in: their
-- attempts' hard limits fall (celery_deadlines.core.cancelling.hard_limits_fall).
SELECT task_id FROM celery_deadlines_run
WHERE task_id {in_values} AND status = 'RUNNING' AND reason = 'cancelled'
