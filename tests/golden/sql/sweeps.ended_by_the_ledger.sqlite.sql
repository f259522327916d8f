SELECT task_id, task_name, status, reason, deadline, detail FROM celery_deadlines_run
WHERE status IN ('EXPIRED', 'FAILED') AND op IN ('expire', 'reconcile')
  AND updated_at > %s AND updated_at <= %s
ORDER BY updated_at
LIMIT %s
