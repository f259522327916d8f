SELECT e.key, e.name, e.fingerprint, e.lease_token, r.id, r.task_id, r.task_name,
    e.state, e.dispatches
FROM celery_deadlines_effect e JOIN celery_deadlines_run r ON r.id = e.run_id
WHERE e.state IN ('DISPATCHED', 'UNKNOWN') AND r.status = 'UNKNOWN'
ORDER BY e.id
LIMIT %s
