UPDATE celery_deadlines_run SET status = %s, reason = %s, detail = %s,
    lease_token = lease_token + 1, owner = '', lease_expires_at = NULL,
    version = version + 1, op = 'celery', op_detail = %s, updated_at = clock_timestamp()
WHERE task_id = %s AND status NOT IN ('SUCCEEDED', 'FAILED', 'EXPIRED') AND NOT EXISTS (SELECT 1 FROM celery_deadlines_effect u WHERE u.run_id = celery_deadlines_run.id AND u.state IN ('DISPATCHED', 'UNKNOWN'))
