SELECT id, document, lease_token, created_at FROM celery_deadlines_runplan
WHERE run_id = %s AND state = 'ACTIVE'
