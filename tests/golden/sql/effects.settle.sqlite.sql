UPDATE celery_deadlines_effect SET state = %s, result = %s,
    evidence = %s, settled_by = %s, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE key = %s AND state = %s AND dispatches = %s AND lease_token = %s
  AND run_id = %s
