UPDATE celery_deadlines_run SET
    status = 'CLOCK_UNCERTAIN', reason = 'clock_uncertain', detail = %s,
    owner = '', lease_expires_at = NULL, op = 'clock_hold', op_detail = %s,
    version = version + 1, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id = %s AND lease_token = %s AND owner = %s AND status = 'RUNNING'
  AND lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
