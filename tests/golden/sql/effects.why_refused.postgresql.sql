INSERT INTO celery_deadlines_runevent (run_id, at, kind, outcome, status, reason, version,
    lease_token, owner, lease_expires_at, detail)
SELECT r.id, clock_timestamp(), 'dispatch', 'rejected', r.status, r.reason, r.version, %s, %s,
    r.lease_expires_at,
    CASE
        WHEN e.state IN ('DISPATCHED', 'UNKNOWN') THEN 'unresolved'
        WHEN e.state IN ('SUCCEEDED', 'FAILED') THEN 'completed'
        WHEN r.deadline IS NOT NULL AND r.deadline <= clock_timestamp() THEN 'deadline_passed'
        WHEN r.lease_token <> %s OR r.owner <> %s OR r.status <> 'RUNNING'
             OR r.lease_expires_at IS NULL OR r.lease_expires_at <= clock_timestamp()
            THEN 'stale_lease'
        ELSE 'changed'
    END || ':' || e.key
FROM celery_deadlines_run r, celery_deadlines_effect e
WHERE r.id = %s AND e.key = %s
  AND EXISTS (SELECT 1 FROM celery_deadlines_run kept WHERE kept.id = r.id FOR KEY SHARE)
RETURNING detail
