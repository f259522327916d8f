SELECT task_name, status, reason, detail, deadline, updated_at FROM celery_deadlines_run
WHERE task_id = %s AND status IN ('SUCCEEDED', 'FAILED', 'EXPIRED')
