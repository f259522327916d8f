SELECT id, task_id, task_name, version, lease_token, owner, lost_leases, deadline,
    deadline IS NOT NULL AND deadline <= clock_timestamp(), delivery_task, reason = 'cancelled'
FROM celery_deadlines_run
WHERE status = 'RUNNING' AND lease_expires_at <= (clock_timestamp() + make_interval(secs => %s))
ORDER BY lease_expires_at
LIMIT %s
