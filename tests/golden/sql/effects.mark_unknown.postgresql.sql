UPDATE celery_deadlines_effect SET state = 'UNKNOWN', updated_at = clock_timestamp(),
    error = 'the attempt ended without recording an outcome'
WHERE run_id = %s AND lease_token = %s AND state = 'DISPATCHED'
