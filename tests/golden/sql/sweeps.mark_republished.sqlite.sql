UPDATE celery_deadlines_run SET published_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), version = version + 1,
    status = CASE WHEN status = 'CLOCK_UNCERTAIN' THEN 'QUEUED' ELSE status END,
    reason = CASE WHEN status = 'CLOCK_UNCERTAIN' THEN '' ELSE reason END,
    op = 'republish', op_detail = '', updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id = %s AND version = %s AND status IN ('QUEUED', 'CLOCK_UNCERTAIN', 'RETRYING')
