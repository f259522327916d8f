SELECT task_id FROM celery_deadlines_run
WHERE task_id IN (SELECT value FROM json_each(%s)) AND status = 'RUNNING' AND reason = 'cancelled'
