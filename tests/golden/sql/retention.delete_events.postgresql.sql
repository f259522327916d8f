DELETE FROM celery_deadlines_runevent WHERE run_id = ANY(%(ids)s)
