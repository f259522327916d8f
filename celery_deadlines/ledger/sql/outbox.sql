-- The producer's statements (celery_deadlines.ledger.sql.outbox): the outbox row before
-- the message, and what is known of a run id before it is published. Each statement
-- under its name; the format and the slots in braces: celery_deadlines/ledger/sql/statements.py.

-- enqueue --
-- Record a run before its message is published; no row changed if the id exists.
INSERT INTO celery_deadlines_run (
    task_id, task_name, status, reason, detail, deadline, delivery_deadline,
    root_id, parent_id, retries, attempt, lost_leases, owner, lease_token,
    version, checkpoint_name, message_body, content_type, content_encoding,
    available_at, published_at, op, op_detail, created_at, updated_at,
    not_before, schedule, schedule_zone, schedule_local, delivery_task, queue
) VALUES (
    %s, %s, 'QUEUED', '', '', %s, %s, %s, %s, %s, 0, 0, '', 0, 0, '', %s, %s, %s,
    %s, {now}, 'enqueue', '', {now}, {now}, %s, %s, %s, %s, %s, %s
)
ON CONFLICT (task_id) DO NOTHING

-- run_id --
SELECT id FROM celery_deadlines_run WHERE task_id = %s

-- publish_failed --
-- End a run whose first publish raised: the caller was told, nothing will run.
UPDATE celery_deadlines_run SET status = 'FAILED', reason = 'publish_failed', detail = %s,
    version = version + 1, op = 'publish_failed', op_detail = %s,
    updated_at = {now}
WHERE task_id = %s AND status = 'QUEUED' AND attempt = 0

-- reopen_unpublished --
-- Record a run again over a run of its id that was never sent (the caller was told, and
-- tries again): its publish raised, or the enqueue gate refused it (ended EXPIRED and
-- never published: refuse_publish). QUEUED with the new message and deadlines.
UPDATE celery_deadlines_run SET status = 'QUEUED', reason = '', detail = '',
    deadline = %s, delivery_deadline = %s, message_body = %s,
    content_type = %s, content_encoding = %s, available_at = %s,
    published_at = {now}, version = version + 1, op = 'enqueue',
    op_detail = 'published again after a failed or refused publish', updated_at = {now}
WHERE task_id = %s AND task_name = %s AND attempt = 0
  AND ((status = 'FAILED' AND reason = 'publish_failed')
       OR (status = 'EXPIRED' AND published_at IS NULL AND op = 'refuse_publish'))

-- record_ended --
-- Insert a run already ended (never claimed), published now if the parameter after the
-- detail says so; no row changed if the id exists.
INSERT INTO celery_deadlines_run (
    task_id, task_name, status, reason, detail, deadline, root_id, parent_id,
    retries, attempt, lost_leases, owner, lease_token, version, checkpoint_name,
    content_type, content_encoding, published_at, op, op_detail, created_at,
    updated_at, not_before, schedule, schedule_zone, schedule_local
) VALUES (
    %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, 0, '', 0, 0, '', '', '',
    CASE WHEN %s THEN {now} END,
    %s, %s, {now}, {now}, %s, %s, %s, %s
)
ON CONFLICT (task_id) DO NOTHING

-- existing --
-- The run already recorded under a task id: its task, status and recorded message (to
-- tell a repeated publish from another run reusing the id).
SELECT task_name, status, message_body, content_type, content_encoding
FROM celery_deadlines_run WHERE task_id = %s
