UPDATE celery_deadlines_run SET
    status = CASE WHEN EXISTS (SELECT 1 FROM celery_deadlines_effect u WHERE u.run_id = celery_deadlines_run.id AND u.state IN ('DISPATCHED', 'UNKNOWN')) THEN 'UNKNOWN' ELSE %s END,
    reason = CASE WHEN EXISTS (SELECT 1 FROM celery_deadlines_effect u WHERE u.run_id = celery_deadlines_run.id AND u.state IN ('DISPATCHED', 'UNKNOWN')) THEN 'effect_unresolved' ELSE %s END,
    detail = %s, lease_token = lease_token + 1, lease_expires_at = NULL,
    version = version + 1, op = 'end_owned', op_detail = %s,
    updated_at = clock_timestamp()
WHERE task_id = %s AND status = 'RUNNING' AND owner = %s
RETURNING id, status
