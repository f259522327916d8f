UPDATE celery_deadlines_effect SET state = 'UNKNOWN', updated_at = clock_timestamp(),
    error = %s
WHERE run_id = %s AND state = 'DISPATCHED'
