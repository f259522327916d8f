SELECT 1 FROM celery_deadlines_effect WHERE run_id = ANY(%(ids)s) FOR UPDATE
