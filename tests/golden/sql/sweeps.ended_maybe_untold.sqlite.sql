SELECT task_id, task_name, status, reason, deadline, detail, updated_at, id
FROM celery_deadlines_run
WHERE status IN ('SUCCEEDED', 'FAILED', 'EXPIRED')
  AND (op IN ('expire', 'reconcile')
       OR (status = 'SUCCEEDED' AND op = 'succeeded' AND result IS NOT NULL
           AND op_detail <> 'eager run'))
  AND updated_at >= %s AND updated_at <= %s
  AND (updated_at > %s OR id > %s)
ORDER BY updated_at, id
LIMIT %s
