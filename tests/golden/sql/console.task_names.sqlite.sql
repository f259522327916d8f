WITH RECURSIVE seen(value) AS (
    SELECT MIN(task_name) FROM celery_deadlines_run WHERE task_name IS NOT NULL
    UNION ALL
    SELECT (SELECT MIN(task_name) FROM celery_deadlines_run WHERE task_name > seen.value AND task_name IS NOT NULL)
    FROM seen WHERE seen.value IS NOT NULL
)
SELECT value FROM seen WHERE value IS NOT NULL LIMIT %s
