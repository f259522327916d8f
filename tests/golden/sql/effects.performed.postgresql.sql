SELECT key, name FROM celery_deadlines_effect WHERE run_id = %s AND state = 'SUCCEEDED' ORDER BY id
