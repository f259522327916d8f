UPDATE celery_deadlines_run SET deadline = LEAST(LEAST(clock_timestamp(), %(at)s), deadline),
    reason = 'cancelled', detail = %(detail)s,
    version = version + 1, op = 'cancel', op_detail = %(detail)s, updated_at = clock_timestamp()
WHERE task_id IN (
    WITH RECURSIVE tree (task_id) AS (
        SELECT task_id FROM celery_deadlines_run WHERE task_id = %(task_id)s
        UNION
        SELECT child.task_id FROM celery_deadlines_run child JOIN tree ON child.parent_id = tree.task_id
    )
    SELECT task_id FROM tree
) AND status NOT IN ('SUCCEEDED', 'FAILED', 'EXPIRED')
