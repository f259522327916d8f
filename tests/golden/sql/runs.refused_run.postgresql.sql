SELECT task_name, status, reason, owner, lease_expires_at, deadline, retries, clock_timestamp()
FROM celery_deadlines_run WHERE task_id = %s
