SELECT status, lease_token, op FROM celery_deadlines_run WHERE id = %s
