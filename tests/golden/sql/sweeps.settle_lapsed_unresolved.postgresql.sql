UPDATE celery_deadlines_run SET status = %s, reason = %s, detail = %s,
    lease_token = lease_token + 1, lease_expires_at = NULL,
    version = version + 1, op = 'reconcile', op_detail = %s,
    updated_at = clock_timestamp()
WHERE id = %s AND version = %s AND status = 'RUNNING'
  AND lease_expires_at <= clock_timestamp() AND EXISTS (SELECT 1 FROM celery_deadlines_effect u WHERE u.run_id = celery_deadlines_run.id AND u.state IN ('DISPATCHED', 'UNKNOWN'))
