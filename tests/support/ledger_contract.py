"""The ledgers the contract suite (tests/django/test_ledger_contract.py) drives, behind
one interface: :class:`celery_deadlines.testing.FakeLedger` on a :class:`FakeClock`,
and :mod:`celery_deadlines.ledger.api` on SQLite or PostgreSQL.

Each is asked what the Celery tier asks of a ledger (``LedgerAPI``: record, claim,
refuse, read back an end) and what an attempt writes through the result of a claim
(checkpoints, its end, effects through :class:`~celery_deadlines.core.effects.EffectScope`).
What a test reads back (:class:`Seen`) is the run's row, or the fake's run.

Time: the fake's clock is moved. The database's clock cannot be, so every instant
stored for the ledger's runs and effects is moved into the past by as much, which is
what the database clock moving on looks like to each comparison (the row's ``op`` says
``age``, as in tests/django/ledger/sql/test_ledger_store.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

import pytest
from celery import Celery

from celery_deadlines.core.effects import EffectScope
from celery_deadlines.ledger import LedgerAPI
from celery_deadlines.rules.records import NewRun, Refusal
from celery_deadlines.rules.states import Status
from celery_deadlines.testing import FakeClock, FakeLedger

TTL = timedelta(seconds=30)
TASK = "shop.charge"
KEY = "order-42:charge:v1"
MESSAGE = b'{"args": [42], "kwargs": {}, "options": {}}'


@dataclass(frozen=True)
class Seen:
    """What a ledger holds for a run, as a test reads it back."""

    status: str
    reason: str
    token: int
    owner: str
    lost_leases: int


class ContractLedger:
    """One ledger under the contract: ``api`` is what the Celery tier calls."""

    name: ClassVar[str]
    api: LedgerAPI
    app: Celery

    # -- the Celery tier's calls ---------------------------------------------------------

    def record(self, task_id: str, *, deadline_in: float | None = None, retries: int = 0) -> Any:
        """Record a run (``deadline_in`` seconds from now): when its message is to be sent
        (:class:`~celery_deadlines.rules.records.Recorded`)."""
        deadline = None if deadline_in is None else self.now() + timedelta(seconds=deadline_in)
        run = NewRun(
            task_id=task_id,
            task_name=TASK,
            deadline=deadline,
            retries=retries,
            message_body=MESSAGE,
        )
        return self.api.record_run(self.app, run)

    def claim(
        self,
        task_id: str,
        worker: str = "w1",
        *,
        retries: int = 0,
        reserve: float = 0,
        task: str = TASK,
    ) -> Any:
        """A worker's claim of the run's message (an attempt, or the refusal); ``task``:
        the task the message names."""
        return self.api.claim_run(
            self.app,
            task_id=task_id,
            task_name=task,
            retries=retries,
            hostname=worker,
            ttl=TTL,
            reserve=timedelta(seconds=reserve),
            unrecorded=lambda: NewRun(task_id=task_id, task_name=TASK),
        )

    def refuse(
        self, task_id: str, *, confirm_within: float | None = None, task: str = TASK
    ) -> Refusal:
        """A gate refuses the run's message for its deadline (``task``: the task the
        message names): what it did to the run."""
        return self.api.refuse_run(
            self.app,
            task_id=task_id,
            task_name=task,
            retries=0,
            status=Status.EXPIRED,
            reason="deadline_passed",
            detail="refused by the gate",
            deadline=None,
            confirm_within=None if confirm_within is None else timedelta(seconds=confirm_within),
        )

    def ended(self, task_id: str) -> Any:
        return self.api.ended_run(self.app, task_id)

    def status(self, task_id: str) -> str | None:
        """The run's status (``None``: not there)."""
        seen = self.seen(task_id)
        return None if seen is None else seen.status

    #: the behaviours this ledger does not play, and why
    not_played: ClassVar[dict[str, str]] = {}

    def requires(self, behaviour: str) -> None:
        """Skip the test, saying why, if this ledger does not play ``behaviour``."""
        if behaviour in self.not_played:
            pytest.skip(f"{self.name} ledger: {self.not_played[behaviour]}")

    @staticmethod
    def charge(attempt: Any, amount: int = 100) -> EffectScope:
        """The attempt's effect ``charge`` (a timeout leaves its outcome unknown)."""
        return EffectScope(
            attempt, "charge", KEY, {"amount": amount}, not_sent=(ConnectionRefusedError,)
        )

    # -- what each ledger does its own way -------------------------------------------------

    def now(self) -> datetime:
        """The ledger's clock."""
        raise NotImplementedError

    def let_pass(self, seconds: float) -> None:
        """Time passes, by the ledger's clock."""
        raise NotImplementedError

    def seen(self, task_id: str) -> Seen | None:
        """The run as the ledger holds it (``None``: not there)."""
        raise NotImplementedError

    def effect_state(self, key: str = KEY) -> tuple[str, int] | None:
        """The effect's state and dispatch count (``None``: not there)."""
        raise NotImplementedError

    def purge(self, older_than: timedelta) -> int:
        """The retention's purge: how many ended runs it deleted."""
        raise NotImplementedError


class Fake(ContractLedger):
    name = "fake"
    not_played: ClassVar[dict[str, str]] = {
        "retention": (
            "the purge is the Django tier's (manage.py deadlines purge and the reconciler's "
            "periodic pass), not a call of the LedgerAPI the Celery tier makes: the fake "
            "keeps every run for the test to read"
        )
    }

    def __init__(self, app: Celery, clock: FakeClock) -> None:
        self.api = self.ledger = FakeLedger()
        self.app, self.clock = app, clock

    def now(self) -> datetime:
        return self.clock.now()

    def let_pass(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def seen(self, task_id: str) -> Seen | None:
        run = self.ledger.runs.get(task_id)
        if run is None:
            return None
        return Seen(run.status, run.reason, run.token, run.owner, run.lost_leases)

    def effect_state(self, key: str = KEY) -> tuple[str, int] | None:
        effect = self.ledger.effects.get(key)
        return None if effect is None else (str(effect.state), effect.dispatches)

    def purge(self, older_than: timedelta) -> int:
        raise AssertionError(self.not_played["retention"])


class Database(ContractLedger):
    def __init__(self, app: Celery, alias: str) -> None:
        from celery_deadlines.ledger import api

        self.api, self.app, self.alias = api, app, alias
        self.name = "sqlite" if alias == "default" else "postgresql"  # type: ignore[misc]

    @property
    def store(self) -> Any:
        from celery_deadlines.ledger import api

        return api.store_for(self.app)

    def now(self) -> datetime:
        now: datetime = self.store.database_now()
        return now

    def let_pass(self, seconds: float) -> None:
        from celery_deadlines.models import Effect, Run

        shift = timedelta(seconds=seconds)
        aged = {
            Run: ("deadline", "lease_expires_at", "published_at", "available_at", "updated_at"),
            Effect: ("created_at", "dispatched_at", "updated_at", "asked_at"),
        }
        for model, names in aged.items():
            for row in model.objects.using(self.alias).all():  # type: ignore[attr-defined]
                changes = {
                    name: getattr(row, name) - shift
                    for name in names
                    if getattr(row, name) is not None
                }
                if model is Run:
                    changes.update(op="age", op_detail=f"test: {seconds} s later")
                model.objects.using(self.alias).filter(pk=row.pk).update(**changes)  # type: ignore[attr-defined]

    def seen(self, task_id: str) -> Seen | None:
        from celery_deadlines.models import Run

        run = Run.objects.using(self.alias).filter(task_id=task_id).first()
        if run is None:
            return None
        return Seen(run.status, run.reason, run.lease_token, run.owner, run.lost_leases)

    def effect_state(self, key: str = KEY) -> tuple[str, int] | None:
        from celery_deadlines.models import Effect

        effect = Effect.objects.using(self.alias).filter(key=key).first()
        return None if effect is None else (str(effect.state), effect.dispatches)

    def purge(self, older_than: timedelta) -> int:
        from celery_deadlines.ledger.retention import purge

        _, counts = purge(self.store, older_than)
        return counts.runs
