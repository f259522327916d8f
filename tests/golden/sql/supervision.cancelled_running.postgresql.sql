SELECT task_id FROM celery_deadlines_run
WHERE task_id = ANY(%s) AND status = 'RUNNING' AND reason = 'cancelled'
