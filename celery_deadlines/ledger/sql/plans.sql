-- The plan ledger's statements (celery_deadlines.ledger.sql.plans): every write is fenced
-- like the run's own, by the attempt's token and owner and a live lease by the database
-- clock (the EXISTS on the run row, the last three parameters). Each statement under its
-- name; the format and the slots in braces: celery_deadlines/ledger/sql/statements.py.

-- supersede --
-- The run's active plan, superseded by the one about to be stored (fenced).
UPDATE celery_deadlines_runplan SET state = 'SUPERSEDED', ended_at = {now},
    detail = 'a newer plan was stored'
WHERE run_id = %s AND state = 'ACTIVE'
  AND EXISTS (SELECT 1 FROM celery_deadlines_run WHERE celery_deadlines_run.id = %s
              AND celery_deadlines_run.lease_token = %s AND celery_deadlines_run.owner = %s
              AND celery_deadlines_run.status = 'RUNNING'
              AND celery_deadlines_run.lease_expires_at > {now})

-- save --
-- A plan stored as the run's active one (fenced, the run row locked to the commit).
INSERT INTO celery_deadlines_runplan (run_id, plan_id, state, document, lease_token, reason,
    detail, created_at)
SELECT celery_deadlines_run.id, %s, 'ACTIVE', {json}, celery_deadlines_run.lease_token, '', '',
    {now}
FROM celery_deadlines_run
WHERE celery_deadlines_run.id = %s AND celery_deadlines_run.lease_token = %s
  AND celery_deadlines_run.owner = %s AND celery_deadlines_run.status = 'RUNNING'
  AND celery_deadlines_run.lease_expires_at > {now}{lock_rows}

-- active --
-- The plan a run follows.
SELECT id, document, lease_token, created_at FROM celery_deadlines_runplan
WHERE run_id = %s AND state = 'ACTIVE'

-- state_of --
SELECT state FROM celery_deadlines_runplan WHERE id = %s

-- invalidate --
-- The active plan, retired as history: it failed its resume gate (fenced).
UPDATE celery_deadlines_runplan SET state = 'INVALIDATED', reason = %s, detail = %s,
    ended_at = {now}
WHERE id = %s AND state = 'ACTIVE'
  AND EXISTS (SELECT 1 FROM celery_deadlines_run WHERE celery_deadlines_run.id = %s
              AND celery_deadlines_run.lease_token = %s AND celery_deadlines_run.owner = %s
              AND celery_deadlines_run.status = 'RUNNING'
              AND celery_deadlines_run.lease_expires_at > {now})
