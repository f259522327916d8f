SELECT DISTINCT e.run_id FROM celery_deadlines_effect e WHERE e.run_id IN (SELECT value FROM json_each(%(ids)s))
  AND (e.state IN ('DISPATCHED', 'UNKNOWN') OR e.updated_at >= %(cutoff)s OR e.asked_at >= %(cutoff)s)
