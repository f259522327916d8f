UPDATE celery_deadlines_run SET lease_expires_at = MIN(strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s), COALESCE(deadline, '9999-12-31 23:59:59')),
    version = version + 1, op = 'renew', op_detail = '', updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id = %s AND lease_token = %s AND owner = %s AND status = 'RUNNING'
  AND lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
  AND (deadline IS NULL OR deadline > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))
RETURNING lease_expires_at
