SELECT task_name, status, message_body, content_type, content_encoding
FROM celery_deadlines_run WHERE task_id = %s
