SELECT status, lease_token, owner, op FROM celery_deadlines_run WHERE id = %s
