SELECT r.id, CAST(r.updated_at AS TEXT) FROM celery_deadlines_run r INDEXED BY cdl_run_ended_idx
WHERE r.status IN ('SUCCEEDED', 'FAILED', 'EXPIRED') AND r.updated_at < %(cutoff)s AND r.updated_at >= %(after)s
  AND NOT EXISTS (SELECT 1 FROM celery_deadlines_effect e WHERE e.run_id = r.id
                  AND (e.state IN ('DISPATCHED', 'UNKNOWN') OR e.updated_at >= %(cutoff)s
                       OR e.asked_at >= %(cutoff)s))
ORDER BY r.updated_at LIMIT %(limit)s
