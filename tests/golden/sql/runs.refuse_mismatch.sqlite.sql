INSERT INTO celery_deadlines_runevent (run_id, at, kind, outcome, status, reason, version, lease_token, owner, lease_expires_at, detail)
SELECT id, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), 'refuse', 'rejected', status, reason, version, lease_token, '',
    lease_expires_at, 'task_mismatch:' || %s
FROM celery_deadlines_run WHERE task_id = %s AND task_name <> %s
