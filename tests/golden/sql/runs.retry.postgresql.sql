UPDATE celery_deadlines_run SET
    status = 'RETRYING', retries = %s, available_at = %s, message_body = %s,
    lease_expires_at = NULL, published_at = clock_timestamp(), op = 'retry', op_detail = %s,
    version = version + 1, updated_at = clock_timestamp()
WHERE id = %s AND lease_token = %s AND owner = %s AND status = 'RUNNING'
  AND lease_expires_at > clock_timestamp()
