SELECT DISTINCT e.run_id FROM celery_deadlines_effect e WHERE e.run_id = ANY(%(ids)s)
  AND (e.state IN ('DISPATCHED', 'UNKNOWN') OR e.updated_at >= %(cutoff)s OR e.asked_at >= %(cutoff)s)
