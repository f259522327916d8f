SELECT r.id, r.task_id, r.task_name FROM celery_deadlines_run r
WHERE r.status = 'UNKNOWN' AND NOT EXISTS (
    SELECT 1 FROM celery_deadlines_effect e WHERE e.run_id = r.id AND e.state IN ('DISPATCHED', 'UNKNOWN')
)
ORDER BY r.id
LIMIT %s
