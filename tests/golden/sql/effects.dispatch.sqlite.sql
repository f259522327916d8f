UPDATE celery_deadlines_effect SET state = 'DISPATCHED', lease_token = %s, run_id = %s,
    dispatches = dispatches + 1, dispatched_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
    settled_by = NULL
WHERE key = %s AND state IN ('INTENT_RECORDED', 'NOT_DISPATCHED')
  AND EXISTS (
    SELECT 1 FROM celery_deadlines_run r
    WHERE r.id = %s AND r.lease_token = %s AND r.owner = %s AND r.status = 'RUNNING'
      AND r.lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
      AND (r.deadline IS NULL OR r.deadline > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))
  )
RETURNING dispatches
