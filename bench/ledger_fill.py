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
