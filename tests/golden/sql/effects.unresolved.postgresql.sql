SELECT 1 FROM celery_deadlines_effect WHERE run_id = %s AND state IN ('DISPATCHED', 'UNKNOWN') LIMIT 1
