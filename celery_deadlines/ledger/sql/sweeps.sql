-- The reconciler's and the scheduler's statements (celery_deadlines.ledger.sql.sweeps):
-- each a compare-and-swap on the state it was decided from. Each statement under its name;
-- the format and the slots in braces: celery_deadlines/ledger/sql/statements.py.

-- known --
-- Which of a list of task ids (the parameter, as Dialect.values makes it) have a run, in
-- any state: a scheduler's durable memory.
SELECT task_id FROM celery_deadlines_run WHERE task_id {in_values}

-- last_occurrence --
-- The latest occurrence of a schedule the ledger holds a run for (any state).
SELECT MAX(not_before) FROM celery_deadlines_run WHERE schedule = %s

-- expire_unclaimed --
-- End runs whose deadline passed while they waited. The reason is the one a worker's gate
-- gives for the same deadline.
UPDATE celery_deadlines_run SET status = 'EXPIRED',
    reason = {expiry_reason},
    detail = CASE WHEN status = 'PAUSED'
                  THEN 'the deadline passed while the run was paused'
                  ELSE 'the deadline passed before any worker claimed the run'
             END,
    version = version + 1, op = 'expire',
    op_detail = {expiry_reason},
    updated_at = {now}
WHERE id IN (
    SELECT id FROM celery_deadlines_run
    WHERE status IN {waiting} AND deadline <= {now}
    LIMIT %s
) AND status IN {waiting} AND deadline <= {now}
RETURNING task_id, task_name, status, reason, deadline, detail

-- ended_maybe_untold --
-- Runs whose caller may not have been told their end, in the order (updated_at, id), after
-- a position in it (the first and third parameters, the fourth) and ended no later than
-- the second (the bounds on updated_at alone let the ended runs' index be read): the ones
-- the sweeper or the reconciler ended FAILED or EXPIRED (it may have died between its
-- commit and telling the caller), and the successes whose completion kept a return value
-- (their worker may have died between that commit and Celery's store of the result; the
-- value is read for the few whose caller was not told: runs.ended), not an eager run's
-- (its caller was told in its own process).
SELECT task_id, task_name, status, reason, deadline, detail, updated_at, id
FROM celery_deadlines_run
WHERE status IN {terminal}
  AND (op IN ('expire', 'reconcile')
       OR (status = 'SUCCEEDED' AND op = 'succeeded' AND result IS NOT NULL
           AND op_detail <> {eager_run}))
  AND updated_at >= %s AND updated_at <= %s
  AND (updated_at > %s OR id > %s)
ORDER BY updated_at, id
LIMIT %s

-- lapsed_leases --
-- Leases lapsed for the supervisor's grace already (its negative is the parameter).
SELECT id, task_id, task_name, version, lease_token, owner, lost_leases, deadline,
    deadline IS NOT NULL AND deadline <= {now}, delivery_task, reason = 'cancelled'
FROM celery_deadlines_run
WHERE status = 'RUNNING' AND lease_expires_at <= {now_plus}
ORDER BY lease_expires_at
LIMIT %s

-- settle_lapsed --
-- A lapsed run ended as decided when none of its effects lacked an outcome, if that still
-- holds (else settle_lapsed_unresolved).
UPDATE celery_deadlines_run SET status = %s, reason = %s, detail = %s,
    lease_token = lease_token + 1, lease_expires_at = NULL,
    version = version + 1, op = 'reconcile', op_detail = %s,
    updated_at = {now}
WHERE id = %s AND version = %s AND status = 'RUNNING'
  AND lease_expires_at <= {now} AND NOT {has_unresolved}

-- settle_lapsed_unresolved --
-- A lapsed run marked UNKNOWN as decided when one of its effects lacked an outcome, if
-- that still holds.
UPDATE celery_deadlines_run SET status = %s, reason = %s, detail = %s,
    lease_token = lease_token + 1, lease_expires_at = NULL,
    version = version + 1, op = 'reconcile', op_detail = %s,
    updated_at = {now}
WHERE id = %s AND version = %s AND status = 'RUNNING'
  AND lease_expires_at <= {now} AND {has_unresolved}

-- requeue_lapsed --
-- A lapsed run queued again (token + 1), if its deadline allows and none of its effects
-- lacks an outcome.
UPDATE celery_deadlines_run SET status = 'QUEUED', lease_token = lease_token + 1, owner = '',
    lease_expires_at = NULL, lost_leases = lost_leases + 1,
    published_at = {now}, version = version + 1, op = 'requeue',
    op_detail = %s, updated_at = {now}
WHERE id = %s AND version = %s AND status = 'RUNNING'
  AND lease_expires_at <= {now}
  AND (deadline IS NULL OR deadline > {now})
  AND NOT {has_unresolved}

-- unclaimed --
-- Runs to publish again. Parameters: the negative republish delay twice, whether held runs
-- go at once (1 or 0), the limit.
SELECT id, task_id, task_name, version, retries, available_at, message_body, content_type, content_encoding
FROM celery_deadlines_run
WHERE status IN {claimable}
  AND ((published_at <= {now_plus}
        AND (available_at IS NULL OR available_at <= {now_plus}))
       OR (status = 'CLOCK_UNCERTAIN' AND %s = 1))
  AND (deadline IS NULL OR deadline > {now})
ORDER BY published_at
LIMIT %s

-- mark_republished --
UPDATE celery_deadlines_run SET published_at = {now}, version = version + 1,
    status = CASE WHEN status = 'CLOCK_UNCERTAIN' THEN 'QUEUED' ELSE status END,
    reason = CASE WHEN status = 'CLOCK_UNCERTAIN' THEN '' ELSE reason END,
    op = 'republish', op_detail = '', updated_at = {now}
WHERE id = %s AND version = %s AND status IN {claimable}

-- fail_unreadable --
UPDATE celery_deadlines_run SET status = 'FAILED', reason = 'message_unreadable', detail = %s,
    version = version + 1, op = 'message_unreadable', op_detail = %s,
    updated_at = {now}
WHERE id = %s AND status IN {claimable}

-- message_of --
SELECT id, task_id, task_name, version, retries, available_at, message_body, content_type, content_encoding FROM celery_deadlines_run WHERE id = %s

-- recorded --
SELECT id, task_id, task_name, version, retries, available_at, message_body, content_type, content_encoding, queue, root_id FROM celery_deadlines_run WHERE task_id = %s

-- end_by_celery --
-- A run Celery ended (a revoke), ended so in the ledger unless one of its effects has no
-- outcome.
UPDATE celery_deadlines_run SET status = %s, reason = %s, detail = %s,
    lease_token = lease_token + 1, owner = '', lease_expires_at = NULL,
    version = version + 1, op = 'celery', op_detail = %s, updated_at = {now}
WHERE task_id = %s AND status NOT IN {terminal} AND NOT {has_unresolved}
