UPDATE celery_deadlines_run SET
    status = CASE WHEN EXISTS (SELECT 1 FROM celery_deadlines_effect u WHERE u.run_id = celery_deadlines_run.id AND u.state IN ('DISPATCHED', 'UNKNOWN')) THEN 'UNKNOWN' ELSE %s END,
    reason = CASE WHEN EXISTS (SELECT 1 FROM celery_deadlines_effect u WHERE u.run_id = celery_deadlines_run.id AND u.state IN ('DISPATCHED', 'UNKNOWN')) THEN 'effect_unresolved' ELSE %s END,
    detail = %s, lease_expires_at = NULL, op = %s, op_detail = %s,
    result = %s, result_content_type = %s, result_encoding = %s, traceback = %s,
    version = version + 1, updated_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE id = %s AND lease_token = %s AND owner = %s AND status = 'RUNNING'
  AND lease_expires_at > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
