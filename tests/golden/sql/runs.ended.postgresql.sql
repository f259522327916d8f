SELECT task_name, status, reason, detail, deadline, updated_at,
    result, result_content_type, result_encoding FROM celery_deadlines_run
WHERE task_id = %s AND status IN ('SUCCEEDED', 'FAILED', 'EXPIRED')
