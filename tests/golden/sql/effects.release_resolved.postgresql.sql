UPDATE celery_deadlines_run SET
    (status, reason, detail, published_at) = (
        SELECT
            CASE WHEN c.past THEN 'EXPIRED' ELSE 'QUEUED' END,
            CASE WHEN NOT c.past THEN ''
                 WHEN c.performed THEN 'performed_past_deadline'
                 ELSE (CASE WHEN reason = 'cancelled' THEN 'cancelled' WHEN delivery_task THEN 'delivery_expired' ELSE 'deadline_passed' END) END,
            CASE WHEN NOT c.past THEN '' WHEN c.performed THEN %s ELSE %s END,
            CASE WHEN c.past THEN celery_deadlines_run.published_at ELSE clock_timestamp() END
        FROM (SELECT (deadline IS NOT NULL AND deadline <= clock_timestamp()) AS past, EXISTS (SELECT 1 FROM celery_deadlines_effect p WHERE p.run_id = celery_deadlines_run.id AND p.state = 'SUCCEEDED') AS performed) c
    ),
    lease_token = lease_token + 1, owner = '', lease_expires_at = NULL,
    version = version + 1, op = 'reconciled', op_detail = %s, updated_at = clock_timestamp()
WHERE id = %s AND status = 'UNKNOWN'
  AND NOT EXISTS (
    SELECT 1 FROM celery_deadlines_effect WHERE run_id = %s AND state IN ('DISPATCHED', 'UNKNOWN')
  )
RETURNING status, reason, deadline, detail
