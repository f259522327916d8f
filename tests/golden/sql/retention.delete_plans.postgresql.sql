DELETE FROM celery_deadlines_runplan WHERE run_id = ANY(%(ids)s)
