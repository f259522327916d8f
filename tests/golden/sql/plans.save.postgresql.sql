INSERT INTO celery_deadlines_runplan (run_id, plan_id, state, document, lease_token, reason,
    detail, created_at)
SELECT celery_deadlines_run.id, %s, 'ACTIVE', CAST(%s AS jsonb), celery_deadlines_run.lease_token, '', '',
    clock_timestamp()
FROM celery_deadlines_run
WHERE celery_deadlines_run.id = %s AND celery_deadlines_run.lease_token = %s
  AND celery_deadlines_run.owner = %s AND celery_deadlines_run.status = 'RUNNING'
  AND celery_deadlines_run.lease_expires_at > clock_timestamp() FOR UPDATE
