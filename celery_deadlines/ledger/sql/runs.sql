-- The run row's statements for the producer's refusals and the attempt
-- (celery_deadlines.ledger.sql.runs). Each statement under its name; the format and the
-- slots in braces: celery_deadlines/ledger/sql/statements.py.

-- claim (postgresql) --
-- The claim: the compare-and-swap that lets exactly one worker run an attempt, and, when
-- it is lost, the rejected event that says why, in one statement (one round trip). Named
-- parameters: task_id, task_name, retries, reserve and ttl (durations as the dialect's
-- now_plus takes them), max_lost, owner, detail, alone, exclusive.
--
-- The claim's condition is the UPDATE's WHERE: each line one check, in the order a refusal
-- is explained. A lost claim's reason is the first check that does not hold (the CASE
-- below: the same checks, in the same order; the last, 'changed', is also the reason of a
-- lost claim whose row meets every check: it raced a claim that changed it). Every won
-- claim increments the fencing token and sets the lease's expiry to the database clock
-- plus the TTL, never past the deadline. A won claim returns true and the lease's columns;
-- a lost one false, in the same twelve columns (the run's token and lease expiry, the
-- event's detail 'why:current owner' where the checkpoint's name is, the database clock,
-- the run's status); no row, no run.
--
-- A lost claim's event explains the row as the claim found it: as this statement's
-- snapshot shows it, unless that showed it a run of the message's task, neither held nor
-- in a state that no claim takes (then a concurrent claim may have held its lock and won:
-- the UPDATE waited, then found the committed row changed), then as it was committed, read
-- under a share lock (which waits for that claim). A row refused for another reason (its
-- deadline, say) is read so too: the same reason, a lock more. The row the event explains
-- is kept to the commit (run_kept): a purge of the run meanwhile waits for the claim, or
-- the claim finds the run gone and records nothing.
--
-- A lost claim changed nothing but the audit trail: when the statement is its own
-- transaction (alone, as the worker's store runs it), its commit does not wait for the WAL
-- to reach the disk (synchronous_commit off for it alone; a database crash within 3 x
-- wal_writer_delay may lose the event, nothing else). A won claim commits so too when its
-- owner runs no other attempt meanwhile (exclusive: a prefork pool process, a solo
-- worker): a crash that loses it returns the run to the queue with its old token, and the
-- next claim issues the same token again, but every later write of the first holder is
-- fenced by its owner as well as its token, so it is refused; and any write of its that
-- did commit waited for the disk, which flushed the claim before it (the WAL is written
-- and replayed in order). An owner that runs several attempts at once (a thread or
-- greenlet pool) cannot be told apart from itself: its claim waits.
--
-- Sent in fewer than 4096 characters: psycopg caches the parsing of a statement no longer.
WITH claimed AS (
    UPDATE celery_deadlines_run SET
        status = 'RUNNING', owner = %(owner)s,
        lease_token = lease_token + 1, version = version + 1, attempt = attempt + 1,
        lost_leases = lost_leases + (CASE WHEN status = 'RUNNING' THEN 1 ELSE 0 END),
        lease_expires_at = {lease_end:ttl},
        op = 'claim', op_detail = %(detail)s, updated_at = {now}
    WHERE task_id = %(task_id)s
      -- task_mismatch: a run is its task's: a message naming another task takes nothing
      -- of it, whatever the run's state (first: its refusal says so, never "terminal")
      AND task_name = %(task_name)s
      -- terminal
      AND status NOT IN {terminal}
      -- stale_message: the message is older than the run
      AND retries = %(retries)s
      -- unresolved: a lapsed attempt dispatched an effect with no recorded outcome:
      -- reconcile first (the live lease tested first: a held run's refusal reads none
      -- of its effects)
      AND NOT (NOT (status = 'RUNNING' AND lease_expires_at > {now}) AND {has_unresolved})
      -- cancelled: a cancelled run (its deadline pulled in by Operator.cancel) is
      -- refused as cancelled, not as past its deadline: its caller is told Celery's revoke
      AND reason <> 'cancelled'
      -- deadline_passed
      AND (deadline IS NULL OR deadline > {now})
      -- deadline: too little is left of it (the reserve)
      AND (deadline IS NULL OR deadline > {now_plus:reserve})
      -- held: a lapsed lease is taken over only after the grace: its supervisor ends it
      -- first (a time limit), and a dispatch guard that passed while it was live has
      -- committed
      AND NOT (status = 'RUNNING' AND lease_expires_at > {now_less_grace})
      -- lost_leases
      AND NOT (status = 'RUNNING' AND lost_leases >= %(max_lost)s)
      -- unknown: it waits for an effect's outcome
      AND status <> 'UNKNOWN'
      -- changed, last: a lost claim whose row meets every check raced a claim that
      -- changed it, and is refused as "changed" too (the refusal's ELSE)
      AND (status IN {claimable} OR status = 'RUNNING')
    RETURNING true AS won, id, lease_token, version, attempt, lease_expires_at, deadline, checkpoint_name, checkpoint_data, {now} AS at,
        CASE WHEN available_at IS NOT NULL AND available_at > published_at
             THEN available_at ELSE published_at END AS waiting_since
),
lost AS (
    SELECT id, task_name, status, reason, version, lease_token, lease_expires_at, owner, deadline, retries, lost_leases, task_name = %(task_name)s AND NOT (status = 'RUNNING' AND lease_expires_at > {now_less_grace}) AND (status IN {claimable} OR status = 'RUNNING') AS raced
    FROM celery_deadlines_run
    WHERE task_id = %(task_id)s AND NOT EXISTS (SELECT 1 FROM claimed)
),
committed AS (
    SELECT id, task_name, status, reason, version, lease_token, lease_expires_at, owner, deadline, retries, lost_leases, true
    FROM celery_deadlines_run
    WHERE task_id = %(task_id)s AND (SELECT raced FROM lost) FOR SHARE
),
refused AS (
    INSERT INTO celery_deadlines_runevent (run_id, at, kind, outcome, status, reason, version, lease_token, owner, lease_expires_at, detail)
    SELECT id, {now}, 'claim', 'rejected', status, reason, version, lease_token,
        %(owner)s, lease_expires_at,
        CASE
            WHEN NOT (task_name = %(task_name)s) THEN 'task_mismatch'
            WHEN NOT (status NOT IN {terminal}) THEN 'terminal'
            WHEN NOT (retries = %(retries)s) THEN 'stale_message'
            WHEN NOT (NOT (NOT (status = 'RUNNING' AND lease_expires_at > {now}) AND {has_unresolved})) THEN 'unresolved'
            WHEN NOT (reason <> 'cancelled') THEN 'cancelled'
            WHEN NOT ((deadline IS NULL OR deadline > {now})) THEN 'deadline_passed'
            WHEN NOT ((deadline IS NULL OR deadline > {now_plus:reserve})) THEN 'deadline'
            WHEN NOT (NOT (status = 'RUNNING' AND lease_expires_at > {now_less_grace})) THEN 'held'
            WHEN NOT (NOT (status = 'RUNNING' AND lost_leases >= %(max_lost)s)) THEN 'lost_leases'
            WHEN NOT (status <> 'UNKNOWN') THEN 'unknown'
            ELSE 'changed'
        END || ':' || CASE WHEN task_name = %(task_name)s THEN owner ELSE %(task_name)s END
    FROM (
        SELECT * FROM lost WHERE NOT raced
          {run_kept:lost}
        UNION ALL SELECT * FROM committed
    ) AS celery_deadlines_run
    RETURNING detail, status, lease_token, lease_expires_at, at
)
SELECT *, NULL
FROM claimed WHERE CASE WHEN %(alone)s AND %(exclusive)s
    THEN set_config('synchronous_commit', 'off', true) IS NOT NULL ELSE true END
UNION ALL
SELECT false, NULL, lease_token, NULL, NULL, lease_expires_at, NULL, detail, NULL, at, NULL, status
FROM refused WHERE CASE WHEN %(alone)s
    THEN set_config('synchronous_commit', 'off', true) IS NOT NULL ELSE true END

-- claim (sqlite) --
-- The claim on SQLite: the compare-and-swap alone, the same checks as PostgreSQL's (its
-- refusal is claim_refusal, a statement of its own).
UPDATE celery_deadlines_run SET
    status = 'RUNNING', owner = %(owner)s,
    lease_token = lease_token + 1, version = version + 1, attempt = attempt + 1,
    lost_leases = lost_leases + (CASE WHEN status = 'RUNNING' THEN 1 ELSE 0 END),
    lease_expires_at = {lease_end:ttl},
    op = 'claim', op_detail = %(detail)s, updated_at = {now}
WHERE task_id = %(task_id)s
  AND task_name = %(task_name)s
  AND status NOT IN {terminal}
  AND retries = %(retries)s
  AND NOT (NOT (status = 'RUNNING' AND lease_expires_at > {now}) AND {has_unresolved})
  AND reason <> 'cancelled'
  AND (deadline IS NULL OR deadline > {now})
  AND (deadline IS NULL OR deadline > {now_plus:reserve})
  AND NOT (status = 'RUNNING' AND lease_expires_at > {now_less_grace})
  AND NOT (status = 'RUNNING' AND lost_leases >= %(max_lost)s)
  AND status <> 'UNKNOWN'
  AND (status IN {claimable} OR status = 'RUNNING')
RETURNING true AS won, id, lease_token, version, attempt, lease_expires_at, deadline, checkpoint_name, checkpoint_data, {now} AS at,
    CASE WHEN available_at IS NOT NULL AND available_at > published_at
         THEN available_at ELSE published_at END AS waiting_since

-- claim_refusal (sqlite) --
-- A lost claim's rejected event on SQLite: the loser is named in the event's owner column,
-- the detail names the first check that fails on the run row (the claim's checks, in their
-- order) and its current owner; task_mismatch's names the task the message named. The row
-- is aliased as the run table: the checks name its columns so. Returns the lost claim's
-- row, in the won claim's twelve columns.
INSERT INTO celery_deadlines_runevent (run_id, at, kind, outcome, status, reason, version, lease_token, owner, lease_expires_at, detail)
SELECT id, {now}, 'claim', 'rejected', status, reason, version, lease_token,
    %(owner)s, lease_expires_at,
    CASE
        WHEN NOT (task_name = %(task_name)s) THEN 'task_mismatch'
        WHEN NOT (status NOT IN {terminal}) THEN 'terminal'
        WHEN NOT (retries = %(retries)s) THEN 'stale_message'
        WHEN NOT (NOT (NOT (status = 'RUNNING' AND lease_expires_at > {now}) AND {has_unresolved})) THEN 'unresolved'
        WHEN NOT (reason <> 'cancelled') THEN 'cancelled'
        WHEN NOT ((deadline IS NULL OR deadline > {now})) THEN 'deadline_passed'
        WHEN NOT ((deadline IS NULL OR deadline > {now_plus:reserve})) THEN 'deadline'
        WHEN NOT (NOT (status = 'RUNNING' AND lease_expires_at > {now_less_grace})) THEN 'held'
        WHEN NOT (NOT (status = 'RUNNING' AND lost_leases >= %(max_lost)s)) THEN 'lost_leases'
        WHEN NOT (status <> 'UNKNOWN') THEN 'unknown'
        ELSE 'changed'
    END || ':' || CASE WHEN task_name = %(task_name)s THEN owner ELSE %(task_name)s END
FROM (SELECT * FROM celery_deadlines_run WHERE task_id = %(task_id)s) AS celery_deadlines_run
RETURNING false, NULL, lease_token, NULL, NULL, lease_expires_at, NULL, detail, NULL, at, NULL, status

-- renew --
-- Extend the lease to the database clock + the TTL, never past the deadline (fenced: the
-- run's id, the token, the owner). No row: the lease is gone.
UPDATE celery_deadlines_run SET lease_expires_at = {lease_end},
    version = version + 1, op = 'renew', op_detail = '', updated_at = {now}
WHERE id = %s AND lease_token = %s AND owner = %s AND status = 'RUNNING'
  AND lease_expires_at > {now}
  AND (deadline IS NULL OR deadline > {now})
RETURNING lease_expires_at

-- cancelled_deadline --
-- What a refused renewal asks: was the run cancelled, and to when.
SELECT deadline FROM celery_deadlines_run WHERE id = %s AND reason = 'cancelled'

-- checkpoint --
-- A fenced write (as finish, retry, release and hold): its own parameters, then the run's
-- id, the token and the owner; it applies while the lease is alive by the database clock
-- (a token alone could be issued twice, when a database crash loses the won claim that
-- issued it first). Persist progress under the attempt's token.
UPDATE celery_deadlines_run SET
    checkpoint_name = %s, checkpoint_data = {json}, checkpoint_at = {now},
    checkpoint_token = lease_token, op = 'checkpoint', op_detail = %s,
    version = version + 1, updated_at = {now}
WHERE id = %s AND lease_token = %s AND owner = %s AND status = 'RUNNING'
  AND lease_expires_at > {now}

-- finish --
-- End the run under the attempt's token (fenced), keeping its result and traceback:
-- UNKNOWN whatever the status given when one of its effects is dispatched without an
-- outcome.
UPDATE celery_deadlines_run SET
    status = CASE WHEN {has_unresolved} THEN 'UNKNOWN' ELSE %s END,
    reason = CASE WHEN {has_unresolved} THEN 'effect_unresolved' ELSE %s END,
    detail = %s, lease_expires_at = NULL, op = %s, op_detail = %s,
    result = %s, result_content_type = %s, result_encoding = %s, traceback = %s,
    version = version + 1, updated_at = {now}
WHERE id = %s AND lease_token = %s AND owner = %s AND status = 'RUNNING'
  AND lease_expires_at > {now}

-- retry --
-- Hand the run to its retry message (fenced): RETRYING, lease released.
UPDATE celery_deadlines_run SET
    status = 'RETRYING', retries = %s, available_at = %s, message_body = %s,
    lease_expires_at = NULL, published_at = {now}, op = 'retry', op_detail = %s,
    version = version + 1, updated_at = {now}
WHERE id = %s AND lease_token = %s AND owner = %s AND status = 'RUNNING'
  AND lease_expires_at > {now}

-- release --
-- Give the run back to the queue (fenced): the task rejected its message with requeue.
UPDATE celery_deadlines_run SET
    status = 'QUEUED', lease_expires_at = NULL, published_at = {now},
    op = 'release', op_detail = %s,
    version = version + 1, updated_at = {now}
WHERE id = %s AND lease_token = %s AND owner = %s AND status = 'RUNNING'
  AND lease_expires_at > {now}

-- hold --
-- Give a just-claimed run back unstarted, as CLOCK_UNCERTAIN (fenced): the claiming
-- worker's clock is beyond the skew budget.
UPDATE celery_deadlines_run SET
    status = 'CLOCK_UNCERTAIN', reason = 'clock_uncertain', detail = %s,
    owner = '', lease_expires_at = NULL, op = 'clock_hold', op_detail = %s,
    version = version + 1, updated_at = {now}
WHERE id = %s AND lease_token = %s AND owner = %s AND status = 'RUNNING'
  AND lease_expires_at > {now}

-- last_write --
-- The run's status, token, owner and last write: did a write whose answer the connection
-- lost commit?
SELECT status, lease_token, owner, op FROM celery_deadlines_run WHERE id = %s

-- ended --
-- How the run of a task id ended, if it has: what a later delivery of its message tells a
-- caller the ended attempt never told.
SELECT task_name, status, reason, detail, deadline, updated_at,
    result, result_content_type, result_encoding FROM celery_deadlines_run
WHERE task_id = %s AND status IN {terminal}

-- record_rejected --
-- A stale holder's rejected write: its token, and the current owner's.
INSERT INTO celery_deadlines_runevent (run_id, at, kind, outcome, status, reason, version, lease_token, owner, lease_expires_at, detail)
SELECT id, {now}, %s, 'rejected', status, reason, version, %s, %s,
    lease_expires_at, 'stale token ' || %s || '; current token ' || lease_token || ' owned by ' || owner
FROM celery_deadlines_run WHERE id = %s
  {run_kept:celery_deadlines_run}

-- record_rejected_because --
-- A rejected write with its reason given (stale_evidence: ...).
INSERT INTO celery_deadlines_runevent (run_id, at, kind, outcome, status, reason, version, lease_token, owner, lease_expires_at, detail)
SELECT id, {now}, %s, 'rejected', status, reason, version, %s, %s,
    lease_expires_at, %s
FROM celery_deadlines_run WHERE id = %s
  {run_kept:celery_deadlines_run}

-- refuse --
-- A gate refused a message: end its run, unless another worker owns it now, it is another
-- task's, or one of its effects has no outcome.
UPDATE celery_deadlines_run SET status = %s, reason = %s, detail = %s, owner = '',
    lease_expires_at = NULL, version = version + 1, op = 'refuse',
    op_detail = %s, updated_at = {now}
WHERE task_id = %s AND task_name = %s AND retries = %s
  AND (status IN {claimable}
       OR (status = 'RUNNING' AND lease_expires_at <= {now}))
  AND NOT {has_unresolved}

-- refuse_for_the_deadline --
-- A refusal for the deadline: as refuse, and only a run whose deadline is within the
-- reserve (the last parameter) of the database clock's now ends (a worker whose clock runs
-- ahead cannot expire it).
UPDATE celery_deadlines_run SET status = %s, reason = %s, detail = %s, owner = '',
    lease_expires_at = NULL, version = version + 1, op = 'refuse',
    op_detail = %s, updated_at = {now}
WHERE task_id = %s AND task_name = %s AND retries = %s
  AND (status IN {claimable}
       OR (status = 'RUNNING' AND lease_expires_at <= {now}))
  AND NOT {has_unresolved}
  AND deadline IS NOT NULL AND deadline <= {now_plus}

-- refuse_mismatch --
-- A gate's refusal of a message that names another task than the run of its id: the run is
-- left as it is; the refusal is its rejected event (the task the message named).
INSERT INTO celery_deadlines_runevent (run_id, at, kind, outcome, status, reason, version, lease_token, owner, lease_expires_at, detail)
SELECT id, {now}, 'refuse', 'rejected', status, reason, version, lease_token, '',
    lease_expires_at, 'task_mismatch:' || %s
FROM celery_deadlines_run WHERE task_id = %s AND task_name <> %s
  {run_kept:celery_deadlines_run}

-- refused_run --
-- The run a refusal did not end, as it is now (why not: runs._not_ended, the refusal's
-- checks in their order).
SELECT task_name, status, reason, owner, lease_expires_at, deadline, retries, {now}
FROM celery_deadlines_run WHERE task_id = %s
