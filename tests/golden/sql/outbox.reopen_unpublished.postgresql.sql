UPDATE celery_deadlines_run SET status = 'QUEUED', reason = '', detail = '',
    deadline = %s, delivery_deadline = %s, message_body = %s,
    content_type = %s, content_encoding = %s, available_at = %s,
    published_at = clock_timestamp(), version = version + 1, op = 'enqueue',
    op_detail = 'published again after a failed or refused publish', updated_at = clock_timestamp()
WHERE task_id = %s AND task_name = %s AND attempt = 0
  AND ((status = 'FAILED' AND reason = 'publish_failed')
       OR (status = 'EXPIRED' AND published_at IS NULL AND op = 'refuse_publish'))
