UPDATE celery_deadlines_effect SET state = %s, result = CAST(%s AS jsonb),
    evidence = CAST(%s AS jsonb), settled_by = %s, updated_at = clock_timestamp()
WHERE key = %s AND state = %s AND dispatches = %s AND lease_token = %s
  AND run_id = %s
