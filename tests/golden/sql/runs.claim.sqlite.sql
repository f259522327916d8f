UPDATE celery_deadlines_run SET
    status = 'RUNNING', owner = %(owner)s,
    lease_token = lease_token + 1, version = version + 1, attempt = attempt + 1,
    lost_leases = lost_leases + (CASE WHEN status = 'RUNNING' THEN 1 ELSE 0 END),
    lease_expires_at = MIN(strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %(ttl)s), COALESCE(deadline, '9999-12-31 23:59:59')),
    op = 'claim', op_detail = %(detail)s, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE task_id = %(task_id)s
  AND task_name = %(task_name)s
  AND status NOT IN ('SUCCEEDED', 'FAILED', 'EXPIRED')
  AND retries = %(retries)s
  AND NOT (NOT (status = 'RUNNING' AND lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')) AND EXISTS (SELECT 1 FROM celery_deadlines_effect u WHERE u.run_id = celery_deadlines_run.id AND u.state IN ('DISPATCHED', 'UNKNOWN')))
  AND reason <> 'cancelled'
  AND (deadline IS NULL OR deadline > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))
  AND (deadline IS NULL OR deadline > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %(reserve)s))
  AND NOT (status = 'RUNNING' AND lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-1.000000 seconds'))
  AND NOT (status = 'RUNNING' AND lost_leases >= %(max_lost)s)
  AND status <> 'UNKNOWN'
  AND (status IN ('QUEUED', 'CLOCK_UNCERTAIN', 'RETRYING') OR status = 'RUNNING')
RETURNING true AS won, id, lease_token, version, attempt, lease_expires_at, deadline, checkpoint_name, checkpoint_data, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') AS at,
    CASE WHEN available_at IS NOT NULL AND available_at > published_at
         THEN available_at ELSE published_at END AS waiting_since
