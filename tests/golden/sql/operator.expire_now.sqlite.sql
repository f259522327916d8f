UPDATE celery_deadlines_run SET status = 'EXPIRED', reason = 'expired_by_operator', detail = %s,
    lease_token = lease_token + 1, lease_expires_at = NULL,
    version = version + 1, op = 'expire_now', op_detail = %s, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id = %s AND status NOT IN ('SUCCEEDED', 'FAILED', 'EXPIRED') AND NOT EXISTS (SELECT 1 FROM celery_deadlines_effect u WHERE u.run_id = celery_deadlines_run.id AND u.state IN ('DISPATCHED', 'UNKNOWN'))
RETURNING task_id, task_name, deadline
