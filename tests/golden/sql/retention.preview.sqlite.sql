WITH ended AS (
    SELECT r.id, EXISTS (SELECT 1 FROM celery_deadlines_effect e WHERE e.run_id = r.id
                         AND (e.state IN ('DISPATCHED', 'UNKNOWN') OR e.updated_at >= %(cutoff)s
                              OR e.asked_at >= %(cutoff)s)) AS kept
    FROM celery_deadlines_run r
    WHERE r.status IN ('SUCCEEDED', 'FAILED', 'EXPIRED') AND r.updated_at < %(cutoff)s
)
SELECT (SELECT count(*) FROM ended WHERE NOT kept),
       (SELECT count(*) FROM ended WHERE kept),
       (SELECT count(*) FROM celery_deadlines_effect
        WHERE run_id IN (SELECT id FROM ended WHERE NOT kept)),
       (SELECT count(*) FROM celery_deadlines_runevent
        WHERE run_id IN (SELECT id FROM ended WHERE NOT kept)),
       (SELECT count(*) FROM celery_deadlines_runplan
        WHERE run_id IN (SELECT id FROM ended WHERE NOT kept))
