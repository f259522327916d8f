-- The operator's actions on a run (celery_deadlines.ledger.sql.operator): each one
-- compare-and-swap. Each statement under its name; the format and the slots in braces:
-- celery_deadlines/ledger/sql/statements.py.

-- cancel (postgresql) --
-- A run and its descendants (parent_id is the parent's task id; UNION visits each once;
-- the recursion inside the WHERE, so that SQLite counts the rows an UPDATE changed), every
-- unended one's deadline pulled in to the database clock's now or the earlier %(at)s,
-- never lengthened: the claim refuses it cancelled, a renewal past it fails, and whoever
-- finds it past ends it cancelled (expiry_reason).
UPDATE celery_deadlines_run SET deadline = LEAST(LEAST({now}, %(at)s), deadline),
    reason = 'cancelled', detail = %(detail)s,
    version = version + 1, op = 'cancel', op_detail = %(detail)s, updated_at = {now}
WHERE task_id IN (
    WITH RECURSIVE tree (task_id) AS (
        SELECT task_id FROM celery_deadlines_run WHERE task_id = %(task_id)s
        UNION
        SELECT child.task_id FROM celery_deadlines_run child JOIN tree ON child.parent_id = tree.task_id
    )
    SELECT task_id FROM tree
) AND status NOT IN {terminal}

-- cancel (sqlite) --
-- The cancel on SQLite: MIN for LEAST, a NULL read as the end of time.
UPDATE celery_deadlines_run SET deadline = MIN(MIN({now}, COALESCE(%(at)s, '9999-12-31 23:59:59')), COALESCE(deadline, '9999-12-31 23:59:59')),
    reason = 'cancelled', detail = %(detail)s,
    version = version + 1, op = 'cancel', op_detail = %(detail)s, updated_at = {now}
WHERE task_id IN (
    WITH RECURSIVE tree (task_id) AS (
        SELECT task_id FROM celery_deadlines_run WHERE task_id = %(task_id)s
        UNION
        SELECT child.task_id FROM celery_deadlines_run child JOIN tree ON child.parent_id = tree.task_id
    )
    SELECT task_id FROM tree
) AND status NOT IN {terminal}

-- expire_now --
-- End an unfinished run at once; its holder, if any, is fenced (token + 1). Left as it
-- is when one of its effects has no recorded outcome: it is resolved first (an EXPIRED
-- run's effects are never asked about again).
UPDATE celery_deadlines_run SET status = 'EXPIRED', reason = 'expired_by_operator', detail = %s,
    lease_token = lease_token + 1, lease_expires_at = NULL,
    version = version + 1, op = 'expire_now', op_detail = %s, updated_at = {now}
WHERE id = %s AND status NOT IN {terminal} AND NOT {has_unresolved}
RETURNING task_id, task_name, deadline

-- requeue_now --
-- Queue a failed, unknown or stuck run again, if its deadline allows: a run another
-- worker holds a live lease on is left alone; a lapsed lease is fenced (token + 1).
UPDATE celery_deadlines_run SET status = 'QUEUED', reason = '', detail = %s,
    lease_token = lease_token + 1, owner = '', lease_expires_at = NULL,
    available_at = NULL, published_at = {now}, version = version + 1,
    op = 'requeue_now', op_detail = %s, updated_at = {now}
WHERE id = %s
  AND (status IN {requeueable}
       OR (status = 'RUNNING' AND lease_expires_at <= {now}))
  AND (deadline IS NULL OR deadline > {now})
  AND message_body IS NOT NULL
  AND NOT {has_unresolved}
