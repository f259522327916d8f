WITH RECURSIVE seen(value) AS (
    SELECT MIN(name) FROM celery_deadlines_effect WHERE name IS NOT NULL
    UNION ALL
    SELECT (SELECT MIN(name) FROM celery_deadlines_effect WHERE name > seen.value AND name IS NOT NULL)
    FROM seen WHERE seen.value IS NOT NULL
)
SELECT value FROM seen WHERE value IS NOT NULL LIMIT %s
