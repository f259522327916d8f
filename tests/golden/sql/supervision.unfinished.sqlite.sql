SELECT 1 FROM celery_deadlines_run WHERE task_id = %s AND status NOT IN ('SUCCEEDED', 'FAILED', 'EXPIRED')
