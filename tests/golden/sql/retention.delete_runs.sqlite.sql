DELETE FROM celery_deadlines_run WHERE id IN (SELECT value FROM json_each(%(ids)s)) AND status IN ('SUCCEEDED', 'FAILED', 'EXPIRED')
