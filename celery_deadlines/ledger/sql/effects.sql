-- The effect ledger's statements (celery_deadlines.ledger.sql.effects). Each statement
-- under its name; the format and the slots in braces:
-- celery_deadlines/ledger/sql/statements.py.

-- record_intent --
-- Record the intent to perform a key, or find it recorded (then it is marked asked for:
-- the purge keeps an effect asked for within the retention).
INSERT INTO celery_deadlines_effect (key, run_id, name, kind, state, lease_token, fingerprint,
    dispatches, error, created_at, updated_at)
VALUES (%s, %s, %s, %s, 'INTENT_RECORDED', %s, %s, 0, '', {now}, {now})
ON CONFLICT (key) DO UPDATE SET asked_at = {now}
RETURNING state, fingerprint, result, lease_token

-- dispatch --
-- The dispatch guard: the effect moves to DISPATCHED only while the caller's run is
-- RUNNING under its token and owner, its lease alive and its deadline not passed, by the
-- database clock. Parameters: the effect's new token and run, its key, then the run's
-- fence (id, token, owner). No row: the call must not be made.
UPDATE celery_deadlines_effect SET state = 'DISPATCHED', lease_token = %s, run_id = %s,
    dispatches = dispatches + 1, dispatched_at = {now}, updated_at = {now},
    settled_by = NULL
WHERE key = %s AND state IN ('INTENT_RECORDED', 'NOT_DISPATCHED')
  AND EXISTS (
    SELECT 1 FROM celery_deadlines_run r
    WHERE r.id = %s AND r.lease_token = %s AND r.owner = %s AND r.status = 'RUNNING'
      AND r.lease_expires_at > {now}
      AND (r.deadline IS NULL OR r.deadline > {now})
  )
RETURNING dispatches

-- dispatch_fresh --
-- The dispatch guard of an effect relying on evidence: as dispatch, and the database clock
-- has not reached the evidence's earliest expiry (the last parameter) either.
UPDATE celery_deadlines_effect SET state = 'DISPATCHED', lease_token = %s, run_id = %s,
    dispatches = dispatches + 1, dispatched_at = {now}, updated_at = {now},
    settled_by = NULL
WHERE key = %s AND state IN ('INTENT_RECORDED', 'NOT_DISPATCHED')
  AND EXISTS (
    SELECT 1 FROM celery_deadlines_run r
    WHERE r.id = %s AND r.lease_token = %s AND r.owner = %s AND r.status = 'RUNNING'
      AND r.lease_expires_at > {now}
      AND (r.deadline IS NULL OR r.deadline > {now})
  )
  AND %s > {now}
RETURNING dispatches

-- why_refused --
-- Why the guard refused (the first reason that holds), recorded as a rejected event.
INSERT INTO celery_deadlines_runevent (run_id, at, kind, outcome, status, reason, version,
    lease_token, owner, lease_expires_at, detail)
SELECT r.id, {now}, 'dispatch', 'rejected', r.status, r.reason, r.version, %s, %s,
    r.lease_expires_at,
    CASE
        WHEN e.state IN {unresolved} THEN 'unresolved'
        WHEN e.state IN ('SUCCEEDED', 'FAILED') THEN 'completed'
        WHEN r.deadline IS NOT NULL AND r.deadline <= {now} THEN 'deadline_passed'
        WHEN r.lease_token <> %s OR r.owner <> %s OR r.status <> 'RUNNING'
             OR r.lease_expires_at IS NULL OR r.lease_expires_at <= {now}
            THEN 'stale_lease'
        ELSE 'changed'
    END || ':' || e.key
FROM celery_deadlines_run r, celery_deadlines_effect e
WHERE r.id = %s AND e.key = %s
  {run_kept:r}
RETURNING detail

-- why_refused_fresh --
-- As why_refused, for an effect relying on evidence (its earliest expiry, the parameter
-- after the owner's).
INSERT INTO celery_deadlines_runevent (run_id, at, kind, outcome, status, reason, version,
    lease_token, owner, lease_expires_at, detail)
SELECT r.id, {now}, 'dispatch', 'rejected', r.status, r.reason, r.version, %s, %s,
    r.lease_expires_at,
    CASE
        WHEN e.state IN {unresolved} THEN 'unresolved'
        WHEN e.state IN ('SUCCEEDED', 'FAILED') THEN 'completed'
        WHEN r.deadline IS NOT NULL AND r.deadline <= {now} THEN 'deadline_passed'
        WHEN r.lease_token <> %s OR r.owner <> %s OR r.status <> 'RUNNING'
             OR r.lease_expires_at IS NULL OR r.lease_expires_at <= {now}
            THEN 'stale_lease'
        WHEN %s <= {now} THEN 'stale_evidence'
        ELSE 'changed'
    END || ':' || e.key
FROM celery_deadlines_run r, celery_deadlines_effect e
WHERE r.id = %s AND e.key = %s
  {run_kept:r}
RETURNING detail

-- outcome_result --
-- An outcome (as outcome_error) is fenced by the run and its token: tokens count per run,
-- and a key may pass from one run to another (reconciled as not sent, then dispatched by a
-- duplicate run).
UPDATE celery_deadlines_effect SET state = %s, result = {json}, updated_at = {now}
WHERE key = %s AND run_id = %s AND lease_token = %s AND state IN {unresolved}

-- outcome_error --
UPDATE celery_deadlines_effect SET state = %s, error = %s, updated_at = {now}
WHERE key = %s AND run_id = %s AND lease_token = %s AND state IN {unresolved}

-- state_of --
SELECT state, lease_token, dispatches FROM celery_deadlines_effect WHERE key = %s

-- unresolved --
SELECT 1 FROM celery_deadlines_effect WHERE run_id = %s AND state IN {unresolved} LIMIT 1

-- unresolved_keys --
SELECT key FROM celery_deadlines_effect WHERE run_id = %s AND state IN {unresolved} ORDER BY id

-- unresolved_names --
SELECT key, name FROM celery_deadlines_effect WHERE run_id = %s AND state IN {unresolved} ORDER BY id

-- mark_unknown --
-- The effects a lapsed attempt (its token) dispatched without an outcome: UNKNOWN. A newer
-- attempt's live dispatch is never touched.
UPDATE celery_deadlines_effect SET state = 'UNKNOWN', updated_at = {now},
    error = 'the attempt ended without recording an outcome'
WHERE run_id = %s AND lease_token = %s AND state = 'DISPATCHED'

-- pending --
-- Unresolved effects of runs waiting (status UNKNOWN) for reconciliation.
SELECT e.key, e.name, e.fingerprint, e.lease_token, r.id, r.task_id, r.task_name,
    e.state, e.dispatches
FROM celery_deadlines_effect e JOIN celery_deadlines_run r ON r.id = e.run_id
WHERE e.state IN {unresolved} AND r.status = 'UNKNOWN'
ORDER BY e.id
LIMIT %s

-- settle --
-- A settlement: a compare-and-swap on the dispatch that was asked about; who settled it is
-- recorded (the audit trigger makes it the event's owner; the next dispatch clears it).
UPDATE celery_deadlines_effect SET state = %s, result = {json},
    evidence = {json}, settled_by = %s, updated_at = {now}
WHERE key = %s AND state = %s AND dispatches = %s AND lease_token = %s
  AND run_id = %s

-- describe --
SELECT state, dispatches, run_id, lease_token FROM celery_deadlines_effect WHERE key = %s

-- settled_unknown --
-- UNKNOWN runs none of whose effects is unresolved any more: they wait only for their
-- release.
SELECT r.id, r.task_id, r.task_name FROM celery_deadlines_run r
WHERE r.status = 'UNKNOWN' AND NOT EXISTS (
    SELECT 1 FROM celery_deadlines_effect e WHERE e.run_id = r.id AND e.state IN {unresolved}
)
ORDER BY r.id
LIMIT %s

-- performed --
SELECT key, name FROM celery_deadlines_effect WHERE run_id = %s AND state = 'SUCCEEDED' ORDER BY id

-- release_resolved --
-- An UNKNOWN run whose effects are all resolved: queued again (token + 1; its message is
-- published, its UNKNOWN detail no longer holds), or, past its deadline, EXPIRED (never
-- resurrected, nothing published): performed_past_deadline with the first detail parameter
-- when an effect of it was performed, else the expiry's reason with the second. The clock
-- is read once for the four columns it decides (PostgreSQL's clock moves within a
-- statement: read twice, a deadline passing between the readings would queue the run with
-- an expiry's reason).
UPDATE celery_deadlines_run SET
    (status, reason, detail, published_at) = (
        SELECT
            CASE WHEN c.past THEN 'EXPIRED' ELSE 'QUEUED' END,
            CASE WHEN NOT c.past THEN ''
                 WHEN c.performed THEN 'performed_past_deadline'
                 ELSE {expiry_reason} END,
            CASE WHEN NOT c.past THEN '' WHEN c.performed THEN %s ELSE %s END,
            CASE WHEN c.past THEN celery_deadlines_run.published_at ELSE {now} END
        FROM (SELECT (deadline IS NOT NULL AND deadline <= {now}) AS past, EXISTS (SELECT 1 FROM celery_deadlines_effect p WHERE p.run_id = celery_deadlines_run.id AND p.state = 'SUCCEEDED') AS performed) c
    ),
    lease_token = lease_token + 1, owner = '', lease_expires_at = NULL,
    version = version + 1, op = 'reconciled', op_detail = %s, updated_at = {now}
WHERE id = %s AND status = 'UNKNOWN'
  AND NOT EXISTS (
    SELECT 1 FROM celery_deadlines_effect WHERE run_id = %s AND state IN {unresolved}
  )
RETURNING status, reason, deadline, detail
