INSERT INTO celery_deadlines_runevent (run_id, at, kind, outcome, status, reason, version, lease_token, owner, lease_expires_at, detail)
SELECT id, clock_timestamp(), %s, 'rejected', status, reason, version, %s, %s,
    lease_expires_at, %s
FROM celery_deadlines_run WHERE id = %s
  AND EXISTS (SELECT 1 FROM celery_deadlines_run kept WHERE kept.id = celery_deadlines_run.id FOR KEY SHARE)
