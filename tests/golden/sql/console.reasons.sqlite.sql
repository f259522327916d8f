WITH RECURSIVE seen(value) AS (
    SELECT MIN(reason) FROM celery_deadlines_run WHERE reason <> ''
    UNION ALL
    SELECT (SELECT MIN(reason) FROM celery_deadlines_run WHERE reason > seen.value AND reason <> '')
    FROM seen WHERE seen.value IS NOT NULL
)
SELECT value FROM seen WHERE value IS NOT NULL LIMIT %s
