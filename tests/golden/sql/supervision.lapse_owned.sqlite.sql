UPDATE celery_deadlines_run SET lease_expires_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s), version = version + 1,
    op = 'worker_lost', op_detail = %s, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE task_id = %s AND status = 'RUNNING' AND owner = %s
