UPDATE celery_deadlines_run SET status = 'QUEUED', lease_token = lease_token + 1, owner = '',
    lease_expires_at = NULL, lost_leases = lost_leases + 1,
    published_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), version = version + 1, op = 'requeue',
    op_detail = %s, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id = %s AND version = %s AND status = 'RUNNING'
  AND lease_expires_at <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
  AND (deadline IS NULL OR deadline > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))
  AND NOT EXISTS (SELECT 1 FROM celery_deadlines_effect u WHERE u.run_id = celery_deadlines_run.id AND u.state IN ('DISPATCHED', 'UNKNOWN'))
