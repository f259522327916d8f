UPDATE celery_deadlines_run SET status = 'QUEUED', lease_token = lease_token + 1, owner = '',
    lease_expires_at = NULL, lost_leases = lost_leases + 1,
    published_at = clock_timestamp(), version = version + 1, op = 'requeue',
    op_detail = %s, updated_at = clock_timestamp()
WHERE id = %s AND version = %s AND status = 'RUNNING'
  AND lease_expires_at <= clock_timestamp()
  AND (deadline IS NULL OR deadline > clock_timestamp())
  AND NOT EXISTS (SELECT 1 FROM celery_deadlines_effect u WHERE u.run_id = celery_deadlines_run.id AND u.state IN ('DISPATCHED', 'UNKNOWN'))
