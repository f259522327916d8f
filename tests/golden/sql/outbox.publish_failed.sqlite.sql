UPDATE celery_deadlines_run SET status = 'FAILED', reason = 'publish_failed', detail = %s,
    version = version + 1, op = 'publish_failed', op_detail = %s,
    updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE task_id = %s AND status = 'QUEUED' AND attempt = 0
