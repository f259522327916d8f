UPDATE celery_deadlines_run SET status = 'EXPIRED',
    reason = (CASE WHEN reason = 'cancelled' THEN 'cancelled' WHEN delivery_task THEN 'delivery_expired' ELSE 'deadline_passed' END),
    detail = CASE WHEN status = 'PAUSED'
                  THEN 'the deadline passed while the run was paused'
                  ELSE 'the deadline passed before any worker claimed the run'
             END,
    version = version + 1, op = 'expire',
    op_detail = (CASE WHEN reason = 'cancelled' THEN 'cancelled' WHEN delivery_task THEN 'delivery_expired' ELSE 'deadline_passed' END),
    updated_at = clock_timestamp()
WHERE id IN (
    SELECT id FROM celery_deadlines_run
    WHERE status IN ('QUEUED', 'CLOCK_UNCERTAIN', 'RETRYING', 'PAUSED') AND deadline <= clock_timestamp()
    LIMIT %s
) AND status IN ('QUEUED', 'CLOCK_UNCERTAIN', 'RETRYING', 'PAUSED') AND deadline <= clock_timestamp()
RETURNING task_id, task_name, status, reason, deadline, detail
