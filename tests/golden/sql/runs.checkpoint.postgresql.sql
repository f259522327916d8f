UPDATE celery_deadlines_run SET
    checkpoint_name = %s, checkpoint_data = CAST(%s AS jsonb), checkpoint_at = clock_timestamp(),
    checkpoint_token = lease_token, op = 'checkpoint', op_detail = %s,
    version = version + 1, updated_at = clock_timestamp()
WHERE id = %s AND lease_token = %s AND owner = %s AND status = 'RUNNING'
  AND lease_expires_at > clock_timestamp()
