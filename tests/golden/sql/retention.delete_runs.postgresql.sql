DELETE FROM celery_deadlines_run WHERE id = ANY(%(ids)s) AND status IN ('SUCCEEDED', 'FAILED', 'EXPIRED')
