SELECT r.id, r.updated_at FROM celery_deadlines_run r
WHERE r.status IN ('SUCCEEDED', 'FAILED', 'EXPIRED') AND r.updated_at < %(cutoff)s
  AND NOT EXISTS (SELECT 1 FROM celery_deadlines_effect e WHERE e.run_id = r.id
                  AND (e.state IN ('DISPATCHED', 'UNKNOWN') OR e.updated_at >= %(cutoff)s
                       OR e.asked_at >= %(cutoff)s))
ORDER BY r.updated_at LIMIT %(limit)s FOR UPDATE OF r SKIP LOCKED
