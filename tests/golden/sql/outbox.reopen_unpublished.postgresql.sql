UPDATE celery_deadlines_run SET status = 'QUEUED', reason = '', detail = '',
    deadline = %s, delivery_deadline = %s, message_body = %s,
    content_type = %s, content_encoding = %s, available_at = %s,
    published_at = clock_timestamp(), version = version + 1, op = 'enqueue',
    op_detail = 'published again after a failed publish', updated_at = clock_timestamp()
WHERE task_id = %s AND task_name = %s AND status = 'FAILED'
  AND reason = 'publish_failed' AND attempt = 0
