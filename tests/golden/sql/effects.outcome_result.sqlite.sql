UPDATE celery_deadlines_effect SET state = %s, result = %s, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE key = %s AND run_id = %s AND lease_token = %s AND state IN ('DISPATCHED', 'UNKNOWN')
