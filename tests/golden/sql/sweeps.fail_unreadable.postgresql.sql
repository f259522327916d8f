UPDATE celery_deadlines_run SET status = 'FAILED', reason = 'message_unreadable', detail = %s,
    version = version + 1, op = 'message_unreadable', op_detail = %s,
    updated_at = clock_timestamp()
WHERE id = %s AND status IN ('QUEUED', 'CLOCK_UNCERTAIN', 'RETRYING')
