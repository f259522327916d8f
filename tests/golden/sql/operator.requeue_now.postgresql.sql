UPDATE celery_deadlines_run SET status = 'QUEUED', reason = '', detail = %s,
    lease_token = lease_token + 1, owner = '', lease_expires_at = NULL,
    available_at = NULL, published_at = clock_timestamp(), version = version + 1,
    op = 'requeue_now', op_detail = %s, updated_at = clock_timestamp()
WHERE id = %s
  AND (status IN ('QUEUED', 'CLOCK_UNCERTAIN', 'RETRYING', 'UNKNOWN', 'PAUSED', 'FAILED')
       OR (status = 'RUNNING' AND lease_expires_at <= clock_timestamp()))
  AND (deadline IS NULL OR deadline > clock_timestamp())
  AND message_body IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM celery_deadlines_effect u WHERE u.run_id = celery_deadlines_run.id AND u.state IN ('DISPATCHED', 'UNKNOWN'))
