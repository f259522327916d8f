DELETE FROM celery_deadlines_effect WHERE run_id IN (SELECT value FROM json_each(%(ids)s))
