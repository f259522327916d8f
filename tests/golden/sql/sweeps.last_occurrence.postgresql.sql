SELECT MAX(not_before) FROM celery_deadlines_run WHERE schedule = %s
