DELETE FROM celery_deadlines_effect WHERE run_id = ANY(%(ids)s)
