UPDATE celery_deadlines_effect SET state = 'DISPATCHED', lease_token = %s, run_id = %s,
    dispatches = dispatches + 1, dispatched_at = clock_timestamp(), updated_at = clock_timestamp(),
    settled_by = NULL
WHERE key = %s AND state IN ('INTENT_RECORDED', 'NOT_DISPATCHED')
  AND EXISTS (
    SELECT 1 FROM celery_deadlines_run r
    WHERE r.id = %s AND r.lease_token = %s AND r.owner = %s AND r.status = 'RUNNING'
      AND r.lease_expires_at > clock_timestamp()
      AND (r.deadline IS NULL OR r.deadline > clock_timestamp())
  )
RETURNING dispatches
