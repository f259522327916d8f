UPDATE celery_deadlines_effect SET state = 'UNKNOWN', updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
    error = %s
WHERE run_id = %s AND state = 'DISPATCHED'
