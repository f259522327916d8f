UPDATE celery_deadlines_run SET
    status = CASE WHEN (deadline IS NOT NULL AND deadline <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')) THEN 'EXPIRED' ELSE 'QUEUED' END,
    reason = CASE WHEN (deadline IS NOT NULL AND deadline <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')) THEN (CASE WHEN delivery_task THEN 'delivery_expired' ELSE 'deadline_passed' END) ELSE '' END,
    lease_token = lease_token + 1, owner = '', lease_expires_at = NULL,
    published_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), version = version + 1, op = 'reconciled',
    op_detail = 'effects resolved', updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id = %s AND status = 'UNKNOWN'
  AND NOT EXISTS (
    SELECT 1 FROM celery_deadlines_effect WHERE run_id = %s AND state IN ('DISPATCHED', 'UNKNOWN')
  )
RETURNING status, reason
