SELECT state, dispatches, run_id, lease_token FROM celery_deadlines_effect WHERE key = %s
