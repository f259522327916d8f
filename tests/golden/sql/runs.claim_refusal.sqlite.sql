INSERT INTO celery_deadlines_runevent (run_id, at, kind, outcome, status, reason, version, lease_token, owner, lease_expires_at, detail)
SELECT id, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), 'claim', 'rejected', status, reason, version, lease_token,
    %(owner)s, lease_expires_at,
    CASE
        WHEN NOT (task_name = %(task_name)s) THEN 'task_mismatch'
        WHEN NOT (status NOT IN ('SUCCEEDED', 'FAILED', 'EXPIRED')) THEN 'terminal'
        WHEN NOT (retries = %(retries)s) THEN 'stale_message'
        WHEN NOT (NOT (NOT (status = 'RUNNING' AND lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')) AND EXISTS (SELECT 1 FROM celery_deadlines_effect u WHERE u.run_id = celery_deadlines_run.id AND u.state IN ('DISPATCHED', 'UNKNOWN')))) THEN 'unresolved'
        WHEN NOT (reason <> 'cancelled') THEN 'cancelled'
        WHEN NOT ((deadline IS NULL OR deadline > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))) THEN 'deadline_passed'
        WHEN NOT ((deadline IS NULL OR deadline > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %(reserve)s))) THEN 'deadline'
        WHEN NOT (NOT (status = 'RUNNING' AND lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-1.000000 seconds'))) THEN 'held'
        WHEN NOT (NOT (status = 'RUNNING' AND lost_leases >= %(max_lost)s)) THEN 'lost_leases'
        WHEN NOT (status <> 'UNKNOWN') THEN 'unknown'
        ELSE 'changed'
    END || ':' || CASE WHEN task_name = %(task_name)s THEN owner ELSE %(task_name)s END
FROM (SELECT * FROM celery_deadlines_run WHERE task_id = %(task_id)s) AS celery_deadlines_run
RETURNING false, NULL, lease_token, NULL, NULL, lease_expires_at, NULL, detail, NULL, at, NULL, status
