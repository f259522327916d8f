SELECT id, task_id, task_name, version, retries, available_at, message_body, content_type, content_encoding
FROM celery_deadlines_run
WHERE status IN ('QUEUED', 'CLOCK_UNCERTAIN', 'RETRYING')
  AND ((published_at <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)
        AND (available_at IS NULL OR available_at <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)))
       OR (status = 'CLOCK_UNCERTAIN' AND %s = 1))
  AND (deadline IS NULL OR deadline > strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))
ORDER BY published_at
LIMIT %s
