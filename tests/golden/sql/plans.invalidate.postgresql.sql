UPDATE celery_deadlines_runplan SET state = 'INVALIDATED', reason = %s, detail = %s,
    ended_at = clock_timestamp()
WHERE id = %s AND state = 'ACTIVE'
  AND EXISTS (SELECT 1 FROM celery_deadlines_run WHERE celery_deadlines_run.id = %s
              AND celery_deadlines_run.lease_token = %s AND celery_deadlines_run.owner = %s
              AND celery_deadlines_run.status = 'RUNNING'
              AND celery_deadlines_run.lease_expires_at > clock_timestamp())
