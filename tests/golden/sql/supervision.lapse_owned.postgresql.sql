UPDATE celery_deadlines_run SET lease_expires_at = (clock_timestamp() + make_interval(secs => %s)), version = version + 1,
    op = 'worker_lost', op_detail = %s, updated_at = clock_timestamp()
WHERE task_id = %s AND status = 'RUNNING' AND owner = %s
