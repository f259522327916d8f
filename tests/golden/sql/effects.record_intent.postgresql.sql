INSERT INTO celery_deadlines_effect (key, run_id, name, kind, state, lease_token, fingerprint,
    dispatches, error, created_at, updated_at)
VALUES (%s, %s, %s, %s, 'INTENT_RECORDED', %s, %s, 0, '', clock_timestamp(), clock_timestamp())
ON CONFLICT (key) DO UPDATE SET asked_at = clock_timestamp()
RETURNING state, fingerprint, result, lease_token
