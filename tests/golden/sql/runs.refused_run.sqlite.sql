SELECT task_name, status, reason, owner, lease_expires_at, deadline, retries, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM celery_deadlines_run WHERE task_id = %s
