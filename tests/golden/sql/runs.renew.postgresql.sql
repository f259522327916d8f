UPDATE celery_deadlines_run SET lease_expires_at = LEAST((clock_timestamp() + make_interval(secs => %s)), deadline),
    version = version + 1, op = 'renew', op_detail = '', updated_at = clock_timestamp()
WHERE id = %s AND lease_token = %s AND owner = %s AND status = 'RUNNING'
  AND lease_expires_at > clock_timestamp()
  AND (deadline IS NULL OR deadline > clock_timestamp())
RETURNING lease_expires_at
