DELETE FROM celery_deadlines_runplan WHERE 1 = 0
