INSERT INTO celery_deadlines_runplan (run_id, plan_id, state, document, lease_token, reason,
    detail, created_at)
SELECT celery_deadlines_run.id, %s, 'ACTIVE', %s, celery_deadlines_run.lease_token, '', '',
    strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
FROM celery_deadlines_run
WHERE celery_deadlines_run.id = %s AND celery_deadlines_run.lease_token = %s
  AND celery_deadlines_run.owner = %s AND celery_deadlines_run.status = 'RUNNING'
  AND celery_deadlines_run.lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
