UPDATE celery_deadlines_runplan SET state = 'SUPERSEDED', ended_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
    detail = 'a newer plan was stored'
WHERE run_id = %s AND state = 'ACTIVE'
  AND EXISTS (SELECT 1 FROM celery_deadlines_run WHERE celery_deadlines_run.id = %s
              AND celery_deadlines_run.lease_token = %s AND celery_deadlines_run.owner = %s
              AND celery_deadlines_run.status = 'RUNNING'
              AND celery_deadlines_run.lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))
