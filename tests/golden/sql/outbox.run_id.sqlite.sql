SELECT id FROM celery_deadlines_run WHERE task_id = %s
