UPDATE celery_deadlines_run SET
    checkpoint_name = %s, checkpoint_data = %s, checkpoint_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'),
    checkpoint_token = lease_token, op = 'checkpoint', op_detail = %s,
    version = version + 1, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id = %s AND lease_token = %s AND owner = %s AND status = 'RUNNING'
  AND lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
