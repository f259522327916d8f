SELECT state, lease_token, dispatches FROM celery_deadlines_effect WHERE key = %s
