"""A transition written in two statements is seen whole or not at all by another worker.

Each test stops a writer between its two statements and lets a reconciler on another
connection look, as the worker's reconciler thread (or another worker's) may at any
instant. On a loaded machine two integration tests caught the halves: a run ended
UNKNOWN by its supervisor while its effect was still DISPATCHED (a reconciler settled
the effect first, and the run's trail lacked the effect's UNKNOWN), and an effect an
operator had settled while its run was still UNKNOWN (a reconciler released the run
first, and the operator was told nothing was released). PostgreSQL only: the race is
between connections to a server; SQLite's in-process writer is single.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections

from celery_deadlines.ledger.operations import settle_effect
from celery_deadlines.ledger.reconcile import reconcile_once
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.models import EffectState, Run, Status
from tests.conftest import service_unavailable
from tests.django.core.test_effects import (
    app,  # noqa: F401 - test_effects' fixture: its app, no effect reconciler, an empty queue
    attempt,
    charge,
    crash_after_dispatch,
    effect,
    effects_app,
    record,
)
from tests.support.processes import reachable

pytestmark = pytest.mark.django_db(transaction=True, databases=["postgres"])


@pytest.fixture
def store() -> Store:
    if not reachable("127.0.0.1", 5432):
        service_unavailable("PostgreSQL 127.0.0.1:5432")
    return Store("postgres")


def from_another_connection(read: Callable[[Store], Any]) -> Any:
    """What ``read`` returns on a connection of its own (another thread's)."""
    seen: list[Any] = []

    def look() -> None:
        try:
            seen.append(read(Store("postgres")))
        finally:
            connections.close_all()

    reader = threading.Thread(target=look)
    reader.start()
    reader.join(30)
    return seen[0]


def look_after(
    monkeypatch: pytest.MonkeyPatch, store: Store, marker: str, read: Callable[[Store], Any]
) -> list[Any]:
    """Run ``read`` on another connection right after the statement containing
    ``marker`` (the first half of a transition); returns what it saw."""
    real = store.execute
    seen: list[Any] = []

    def execute(sql: str, params: Any, **kwargs: Any) -> Any:
        answer = real(sql, params, **kwargs)
        if marker in sql and not seen:
            seen.append(from_another_connection(read))
        return answer

    monkeypatch.setattr(store, "execute", execute)
    return seen


def pending_keys(store: Store) -> list[str]:
    return [pending.key for pending in store.effects.pending()]


def test_a_run_its_supervisor_ends_unknown_is_never_seen_before_its_effect_is(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(store)
    charge(attempt(store, "w1:1")).__enter__()  # dispatched, no outcome: the call hangs
    seen = look_after(monkeypatch, store, "op = 'end_owned'", pending_keys)
    written = store.supervision.end_owned(
        "charge-1", "w1:1", Status.EXPIRED, "deadline_passed", "hard time limit"
    )
    assert written == Status.UNKNOWN
    assert seen == [[]]  # not a run UNKNOWN whose effect is still DISPATCHED
    assert effect(store).state == EffectState.UNKNOWN
    assert pending_keys(store) == ["order-42:charge:v1"]


@pytest.mark.usefixtures("app")
def test_a_lapsed_run_marked_unknown_is_never_seen_before_its_effect_is(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    crash_after_dispatch(store)
    seen = look_after(monkeypatch, store, "op = 'reconcile'", pending_keys)
    assert reconcile_once(effects_app, store).unknown == ["charge-1"]
    assert seen == [[]]
    assert effect(store).state == EffectState.UNKNOWN


@pytest.mark.usefixtures("app")
def test_an_effect_settled_by_an_operator_is_never_seen_before_its_runs_release(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    crash_after_dispatch(store)
    reconcile_once(effects_app, store)  # no reconciler: UNKNOWN, waiting for an operator
    [question] = store.effects.pending()
    seen = look_after(
        monkeypatch, store, "evidence =", lambda other: other.effects.settled_unknown()
    )
    settled = settle_effect(
        effects_app,
        store,
        question,
        found=True,
        result={"charge": "ch_7"},
        evidence="ch_7",
        by="ops",
    )
    assert seen == [[]]  # no reconciler could release the run first
    assert (settled.applied, settled.released) == (True, Status.QUEUED)
    assert Run.objects.using("postgres").get(task_id="charge-1").status == Status.QUEUED
