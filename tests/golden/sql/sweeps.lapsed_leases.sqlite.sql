SELECT id, task_id, task_name, version, lease_token, owner, lost_leases, deadline,
    deadline IS NOT NULL AND deadline <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), delivery_task, reason = 'cancelled'
FROM celery_deadlines_run
WHERE status = 'RUNNING' AND lease_expires_at <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)
ORDER BY lease_expires_at
LIMIT %s
