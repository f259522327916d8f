WITH RECURSIVE seen(value) AS (
    SELECT MIN(queue) FROM celery_deadlines_run WHERE queue IS NOT NULL
    UNION ALL
    SELECT (SELECT MIN(queue) FROM celery_deadlines_run WHERE queue > seen.value AND queue IS NOT NULL)
    FROM seen WHERE seen.value IS NOT NULL
)
SELECT value FROM seen WHERE value IS NOT NULL LIMIT %s
