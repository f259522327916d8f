"""The plan ledger's statements: a run's plans, the one it follows and its history.

Every write is fenced like the run's own (the attempt's token, a live lease, by the
database clock), so a stale attempt can neither store a plan nor retire one. A run has
at most one ACTIVE plan (a partial unique index); storing a new one supersedes it, and
a plan that fails its resume gate is INVALIDATED with the reason: both stay as history.

Each statement's text is in ``plans.sql``, under its name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from .rows import Lease
from .statements import Statements, queries

_SQL: Final = queries("plans")
SUPERSEDE: Final = _SQL["supersede"]
SAVE: Final = _SQL["save"]
ACTIVE: Final = _SQL["active"]
STATE_OF: Final = _SQL["state_of"]
INVALIDATE: Final = _SQL["invalidate"]


@dataclass(frozen=True)
class StoredPlan:
    """The active plan of a run, as stored."""

    row_id: int
    document: dict[str, Any]
    lease_token: int
    created_at: datetime


class Plans(Statements):
    """The plan statements, on a :class:`Store`'s connection and dialect."""

    def save(self, lease: Lease, owner: str, plan_id: str, document: dict[str, Any]) -> bool:
        """Make ``document`` the run's active plan (the previous one is superseded).
        ``False``: the attempt no longer owns the run; nothing was stored, and the refusal
        is recorded as a rejected event.

        Two statements: if the lease is lost between them the previous plan is left
        superseded and the run has no active plan, which is safe (the next attempt plans
        from fresh observations; a plan is never executed without passing the gate)."""
        d = self.store.dialect
        self.store.execute(
            SUPERSEDE.text[d.vendor],
            [lease.run_id, lease.run_id, lease.token, lease.owner],
        )
        count, _ = self.store.execute(
            SAVE.text[d.vendor],
            [plan_id, json.dumps(document), lease.run_id, lease.token, lease.owner],
        )
        if count != 1:
            self.store.runs.record_rejected(lease.run_id, "save_plan", lease.token, owner)
        return count == 1

    def active(self, run_id: int) -> StoredPlan | None:
        """The plan the run follows, if it has one."""
        d = self.store.dialect
        _, rows = self.store.execute(
            ACTIVE.text[d.vendor],
            [run_id],
        )
        if not rows:
            return None
        row_id, document, token, created_at = rows[0]
        if isinstance(document, (str, bytes)):
            document = json.loads(document)
        created = d.instant(created_at)
        assert created is not None
        return StoredPlan(row_id, document, token, created)

    def state_of(self, row_id: int) -> str | None:
        """The state of plan ``row_id`` (``None``: no such plan)."""
        _, rows = self.store.execute(STATE_OF.text[self.store.dialect.vendor], [row_id])
        return str(rows[0][0]) if rows else None

    def invalidate(self, lease: Lease, owner: str, row_id: int, reason: str, detail: str) -> bool:
        """Retire the active plan ``row_id`` as history: it failed its resume gate.
        ``False`` (recorded as a rejected event): the attempt no longer owns the run."""
        d = self.store.dialect
        count, _ = self.store.execute(
            INVALIDATE.text[d.vendor],
            [reason, detail, row_id, lease.run_id, lease.token, lease.owner],
        )
        if count != 1:
            self.store.runs.record_rejected(lease.run_id, "invalidate_plan", lease.token, owner)
        return count == 1
