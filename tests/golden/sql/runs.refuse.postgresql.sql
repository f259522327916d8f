UPDATE celery_deadlines_run SET status = %s, reason = %s, detail = %s, owner = '',
    lease_expires_at = NULL, version = version + 1, op = 'refuse',
    op_detail = %s, updated_at = clock_timestamp()
WHERE task_id = %s AND task_name = %s AND retries = %s
  AND (status IN ('QUEUED', 'CLOCK_UNCERTAIN', 'RETRYING')
       OR (status = 'RUNNING' AND lease_expires_at <= clock_timestamp()))
  AND NOT EXISTS (SELECT 1 FROM celery_deadlines_effect u WHERE u.run_id = celery_deadlines_run.id AND u.state IN ('DISPATCHED', 'UNKNOWN'))
