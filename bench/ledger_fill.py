"""Bulk rows for the benchmarks that need a large ledger (``bench/retention.py``,
``bench/ledger_scale.py``): ``INSERT ... SELECT`` over runs already written, with the
ledger's audit triggers off meanwhile (the rows are history, not transitions)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: Runs a statement with optional parameters (without them, a ``%`` is a ``%``).
Execute = Callable[..., Any]

#: Three applied events (enqueue, claim, succeed) for each run ``r`` matching ``{where}``.
THREE_EVENTS = """
    INSERT INTO celery_deadlines_runevent (run_id, at, kind, outcome, status, reason,
        version, lease_token, owner, detail)
    SELECT r.id, r.updated_at, k.kind, 'applied', r.status, '', k.v, 1, '', ''
    FROM celery_deadlines_run r
    CROSS JOIN (VALUES ('enqueue', 1), ('claim', 2), ('succeed', 3)) AS k(kind, v)
    WHERE {where}
"""

#: One ``charge`` effect, in the state given as its parameter, for each run matching
#: ``{where}``.
ONE_EFFECT = """
    INSERT INTO celery_deadlines_effect (key, run_id, name, kind, state, lease_token,
        fingerprint, dispatches, error, created_at, updated_at)
    SELECT 'key-' || r.task_id, r.id, 'charge', 'execution', %s, 1, 'f', 1, '',
        r.updated_at, r.updated_at
    FROM celery_deadlines_run r WHERE {where}
"""


def events(execute: Execute, where: str) -> None:
    execute(THREE_EVENTS.format(where=where))


def effects(execute: Execute, where: str, state: str) -> None:
    execute(ONE_EFFECT.format(where=where), [state])


@contextmanager
def triggers_off(execute: Execute) -> Iterator[None]:
    """The audit triggers off while the rows are written; then the planner's statistics
    are brought up to date (``ANALYZE``), as the benchmarks time plans on them."""
    for table in ("run", "effect"):
        execute(f"ALTER TABLE celery_deadlines_{table} DISABLE TRIGGER USER")
    yield
    for table in ("run", "effect"):
        execute(f"ALTER TABLE celery_deadlines_{table} ENABLE TRIGGER USER")
    execute("ANALYZE")


# -- a ledger as an operator's console meets it (the admin's list pages) -------------------

#: Run ``n``'s task name: step_1 to step_11, each twice as common as the one before
#: (step_11 is half the runs), and step_0 and step_12 one in 4,096 each, so a filter
#: meets rare and common values.
TASK_NAME_OF_N = "'shop.tasks.step_' || floor(log(2, 1 + mod(n, 4096)))::int"
#: Run ``n``'s queue: 5 queues, skewed the same way; one run in 50 has none recorded.
QUEUE_OF_N = (
    "CASE WHEN mod(n, 50) = 0 THEN NULL ELSE "
    "(ARRAY['celery', 'warehouse', 'payments', 'mail', 'reports'])"
    "[1 + floor(log(2, 1 + mod(n, 31)))::int] END"
)
#: Run ``n``'s status and reason: most succeed; one in 20 fails, one in 20 expires, one
#: in 1,000 waits UNKNOWN for an effect.
STATUS_OF_N = (
    "CASE WHEN mod(n, 1000) = 3 THEN 'UNKNOWN' WHEN mod(n, 20) = 1 THEN 'FAILED' "
    "WHEN mod(n, 20) = 2 THEN 'EXPIRED' ELSE 'SUCCEEDED' END"
)
REASON_OF_N = (
    "CASE WHEN mod(n, 1000) = 3 THEN 'effect_unresolved' "
    "WHEN mod(n, 20) = 1 THEN (ARRAY['error', 'time_limit', 'worker_lost'])[1 + mod(n, 3)] "
    "WHEN mod(n, 20) = 2 THEN (ARRAY['deadline_passed', 'retry_budget_exhausted', "
    "'insufficient_budget', 'performed_past_deadline'])[1 + mod(n, 4)] ELSE '' END"
)
#: Run ``n``'s task id: a UUID, as Celery makes them (the list shows its first 8 hex).
TASK_ID_OF_N = "md5('run-' || n)::uuid::text"

CONSOLE_RUNS = f"""
    INSERT INTO celery_deadlines_run (task_id, task_name, status, reason, detail, deadline,
        root_id, parent_id, retries, attempt, lost_leases, owner, lease_token, version,
        checkpoint_name, content_type, content_encoding, queue, published_at, op,
        op_detail, created_at, updated_at)
    SELECT {TASK_ID_OF_N}, {TASK_NAME_OF_N}, {STATUS_OF_N}, {REASON_OF_N}, '',
        t.at + interval '1 minute', md5('run-' || (n - mod(n, 10)))::uuid::text,
        CASE WHEN mod(n, 10) = 0 THEN '' ELSE md5('run-' || (n - mod(n, 10)))::uuid::text END,
        0, 1, 0, 'celery@shop:1', 1, 3, '', 'application/json', 'utf-8', {QUEUE_OF_N},
        t.at, 'bench', '', t.at, t.at + interval '2 seconds'
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n,
        LATERAL (SELECT now() - (%(last)s - n) * %(spacing)s * interval '1 second' AS at) t
"""

#: One effect for every fifth console run: four names, one in a hundred a delivery; an
#: UNKNOWN run's effect is UNKNOWN.
CONSOLE_EFFECTS = """
    INSERT INTO celery_deadlines_effect (key, run_id, name, kind, state, lease_token,
        fingerprint, dispatches, error, created_at, updated_at)
    SELECT 'order-' || r.id || ':' || k.name, r.id, k.name,
        CASE WHEN mod(r.id, 100) = 5 THEN 'delivery' ELSE 'execution' END,
        CASE WHEN r.status = 'UNKNOWN' THEN 'UNKNOWN' ELSE 'SUCCEEDED' END,
        1, 'f', 1, '', r.created_at, r.updated_at
    FROM celery_deadlines_run r,
        LATERAL (SELECT (ARRAY['charge', 'capture', 'email', 'label'])[1 + mod(r.id, 4)] AS name) k
    WHERE r.id > %(after)s AND (mod(r.id, 5) = 0 OR r.status = 'UNKNOWN')
"""


def console_runs(execute: Execute, first: int, last: int, days: float) -> None:
    """Runs ``first`` to ``last`` (their ``n``) as an operator's console meets them,
    created one after another over the last ``days`` (the newest now), three events
    each and an effect for every fifth: set-based SQL, no row built in Python. Call it
    inside :func:`triggers_off`."""
    spacing = days * 86400 / max(last - first + 1, 1)
    window = {"first": first, "last": last, "spacing": spacing}
    ids = execute("SELECT COALESCE(MAX(id), 0) FROM celery_deadlines_run")
    before = int(ids[0][0]) if ids else 0
    execute(CONSOLE_RUNS, window)
    where = f"r.id > {before}"
    events(execute, where)
    execute(CONSOLE_EFFECTS, {"after": before})
