SELECT id, task_id, task_name, version, retries, available_at, message_body, content_type, content_encoding, queue, root_id FROM celery_deadlines_run WHERE task_id = %s
