INSERT INTO celery_deadlines_run (
    task_id, task_name, status, reason, detail, deadline, delivery_deadline,
    root_id, parent_id, retries, attempt, lost_leases, owner, lease_token,
    version, checkpoint_name, message_body, content_type, content_encoding,
    available_at, published_at, op, op_detail, created_at, updated_at,
    not_before, schedule, schedule_zone, schedule_local, delivery_task, queue
) VALUES (
    %s, %s, 'QUEUED', '', '', %s, %s, %s, %s, %s, 0, 0, '', 0, 0, '', %s, %s, %s,
    %s, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), 'enqueue', '', strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), %s, %s, %s, %s, %s, %s
)
ON CONFLICT (task_id) DO NOTHING
