SELECT state FROM celery_deadlines_runplan WHERE id = %s
