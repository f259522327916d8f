WITH claimed AS (
    UPDATE celery_deadlines_run SET
        status = 'RUNNING', owner = %(owner)s,
        lease_token = lease_token + 1, version = version + 1, attempt = attempt + 1,
        lost_leases = lost_leases + (CASE WHEN status = 'RUNNING' THEN 1 ELSE 0 END),
        lease_expires_at = LEAST((clock_timestamp() + make_interval(secs => %(ttl)s)), deadline),
        op = 'claim', op_detail = %(detail)s, updated_at = clock_timestamp()
    WHERE task_id = %(task_id)s
      AND task_name = %(task_name)s
      AND status NOT IN ('SUCCEEDED', 'FAILED', 'EXPIRED')
      AND retries = %(retries)s
      AND NOT (NOT (status = 'RUNNING' AND lease_expires_at > clock_timestamp()) AND EXISTS (SELECT 1 FROM celery_deadlines_effect u WHERE u.run_id = celery_deadlines_run.id AND u.state IN ('DISPATCHED', 'UNKNOWN')))
      AND reason <> 'cancelled'
      AND (deadline IS NULL OR deadline > clock_timestamp())
      AND (deadline IS NULL OR deadline > (clock_timestamp() + make_interval(secs => %(reserve)s)))
      AND NOT (status = 'RUNNING' AND lease_expires_at > (clock_timestamp() + make_interval(secs => -1.0)))
      AND NOT (status = 'RUNNING' AND lost_leases >= %(max_lost)s)
      AND status <> 'UNKNOWN'
      AND (status IN ('QUEUED', 'CLOCK_UNCERTAIN', 'RETRYING') OR status = 'RUNNING')
    RETURNING true AS won, id, lease_token, version, attempt, lease_expires_at, deadline, checkpoint_name, checkpoint_data, clock_timestamp() AS at,
        CASE WHEN available_at IS NOT NULL AND available_at > published_at
             THEN available_at ELSE published_at END AS waiting_since
),
lost AS (
    SELECT id, task_name, status, reason, version, lease_token, lease_expires_at, owner, deadline, retries, lost_leases, task_name = %(task_name)s AND NOT (status = 'RUNNING' AND lease_expires_at > (clock_timestamp() + make_interval(secs => -1.0))) AND (status IN ('QUEUED', 'CLOCK_UNCERTAIN', 'RETRYING') OR status = 'RUNNING') AS raced
    FROM celery_deadlines_run
    WHERE task_id = %(task_id)s AND NOT EXISTS (SELECT 1 FROM claimed)
),
committed AS (
    SELECT id, task_name, status, reason, version, lease_token, lease_expires_at, owner, deadline, retries, lost_leases, true
    FROM celery_deadlines_run
    WHERE task_id = %(task_id)s AND (SELECT raced FROM lost) FOR SHARE
),
refused AS (
    INSERT INTO celery_deadlines_runevent (run_id, at, kind, outcome, status, reason, version, lease_token, owner, lease_expires_at, detail)
    SELECT id, clock_timestamp(), 'claim', 'rejected', status, reason, version, lease_token,
        %(owner)s, lease_expires_at,
        CASE
            WHEN NOT (task_name = %(task_name)s) THEN 'task_mismatch'
            WHEN NOT (status NOT IN ('SUCCEEDED', 'FAILED', 'EXPIRED')) THEN 'terminal'
            WHEN NOT (retries = %(retries)s) THEN 'stale_message'
            WHEN NOT (NOT (NOT (status = 'RUNNING' AND lease_expires_at > clock_timestamp()) AND EXISTS (SELECT 1 FROM celery_deadlines_effect u WHERE u.run_id = celery_deadlines_run.id AND u.state IN ('DISPATCHED', 'UNKNOWN')))) THEN 'unresolved'
            WHEN NOT (reason <> 'cancelled') THEN 'cancelled'
            WHEN NOT ((deadline IS NULL OR deadline > clock_timestamp())) THEN 'deadline_passed'
            WHEN NOT ((deadline IS NULL OR deadline > (clock_timestamp() + make_interval(secs => %(reserve)s)))) THEN 'deadline'
            WHEN NOT (NOT (status = 'RUNNING' AND lease_expires_at > (clock_timestamp() + make_interval(secs => -1.0)))) THEN 'held'
            WHEN NOT (NOT (status = 'RUNNING' AND lost_leases >= %(max_lost)s)) THEN 'lost_leases'
            WHEN NOT (status <> 'UNKNOWN') THEN 'unknown'
            ELSE 'changed'
        END || ':' || CASE WHEN task_name = %(task_name)s THEN owner ELSE %(task_name)s END
    FROM (
        SELECT * FROM lost WHERE NOT raced
          AND EXISTS (SELECT 1 FROM celery_deadlines_run kept WHERE kept.id = lost.id FOR KEY SHARE)
        UNION ALL SELECT * FROM committed
    ) AS celery_deadlines_run
    RETURNING detail, status, lease_token, lease_expires_at, at
)
SELECT *, NULL
FROM claimed WHERE CASE WHEN %(alone)s AND %(exclusive)s
    THEN set_config('synchronous_commit', 'off', true) IS NOT NULL ELSE true END
UNION ALL
SELECT false, NULL, lease_token, NULL, NULL, lease_expires_at, NULL, detail, NULL, at, NULL, status
FROM refused WHERE CASE WHEN %(alone)s
    THEN set_config('synchronous_commit', 'off', true) IS NOT NULL ELSE true END
