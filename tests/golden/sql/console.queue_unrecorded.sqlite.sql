SELECT 1 FROM celery_deadlines_run WHERE queue IS NULL LIMIT 1
