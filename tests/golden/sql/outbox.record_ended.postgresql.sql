INSERT INTO celery_deadlines_run (
    task_id, task_name, status, reason, detail, deadline, root_id, parent_id,
    retries, attempt, lost_leases, owner, lease_token, version, checkpoint_name,
    content_type, content_encoding, published_at, op, op_detail, created_at,
    updated_at, not_before, schedule, schedule_zone, schedule_local
) VALUES (
    %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, 0, '', 0, 0, '', '', '',
    CASE WHEN %s THEN clock_timestamp() END,
    %s, %s, clock_timestamp(), clock_timestamp(), %s, %s, %s, %s
)
ON CONFLICT (task_id) DO NOTHING
