"""Eager runs (``apply()``, ``task_always_eager``) of a body that calls ``self.effect``.

The database's ledger claims no eager run (it has no worker to renew the lease or
reconcile it): the effect says it needs a worker and how to test it. The in-memory
ledger a test installs (``use_ledger(FakeLedger())``, or the pytest plugin) claims
eager runs too: the effect runs once per key, and an eager retry is handed its run
as a worker's retry message is.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_deadlines import ConfigurationError, DeadlineTask
from celery_deadlines.testing import FakeClock, FakeLedger, use_ledger


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery(f"eager-{uuid.uuid4().hex[:6]}", broker="memory://", backend="cache+memory://")
    yield app
    app.close()


@pytest.fixture
def ledger(clock: FakeClock) -> Iterator[FakeLedger]:
    with use_ledger(FakeLedger()) as fake:
        yield fake


class Provider:
    """What the effect calls: its calls, and how many times it first cannot connect."""

    def __init__(self, unreachable: int = 0) -> None:
        self.calls: list[str] = []
        self.unreachable = unreachable

    def charge(self, order: str) -> str:
        if self.unreachable:
            self.unreachable -= 1
            raise ConnectionRefusedError(order)
        self.calls.append(order)
        return f"receipt-{order}"


def charge_task(app: Celery, provider: Provider) -> Any:
    @app.task(base=DeadlineTask, bind=True, name="eager.charge", budget=60, shared=False)
    def charge(self: DeadlineTask, order: str) -> str:
        try:
            with self.effect("charge", key=f"{order}:charge", not_sent=(ConnectionRefusedError,)):
                receipt = provider.charge(order)
        except ConnectionRefusedError as refused:
            raise self.retry(exc=refused, countdown=0) from refused
        return receipt

    return charge


def test_an_eager_apply_claims_its_run_in_the_in_memory_ledger_and_runs_its_effect(
    app: Celery, ledger: FakeLedger
) -> None:
    provider = Provider()
    result = charge_task(app, provider).apply(("o-1",), task_id="r-1")
    assert (result.state, result.get()) == ("SUCCESS", "receipt-o-1")
    assert provider.calls == ["o-1"]
    run = ledger.run("r-1")
    assert (run.status, run.attempt) == ("SUCCEEDED", 1)
    assert ledger.effects["o-1:charge"].state == "SUCCEEDED"


def test_an_always_eager_delay_records_its_run_then_claims_it(
    app: Celery, ledger: FakeLedger
) -> None:
    app.conf.task_always_eager = True
    provider = Provider()
    result = charge_task(app, provider).apply_async(("o-2",), task_id="r-2")
    assert result.get() == "receipt-o-2"
    kinds = [(kind, outcome) for kind, outcome, _ in ledger.run("r-2").events]
    assert kinds[:2] == [("enqueue", "applied"), ("claim", "applied")]
    assert ledger.run("r-2").status == "SUCCEEDED"


def test_an_eager_retry_is_handed_its_run_and_the_effect_is_made_once(
    app: Celery, ledger: FakeLedger
) -> None:
    provider = Provider(unreachable=1)
    result = charge_task(app, provider).apply(("o-3",), task_id="r-3")
    assert result.get() == "receipt-o-3"
    assert provider.calls == ["o-3"]
    run = ledger.run("r-3")
    assert (run.status, run.retries, run.attempt) == ("SUCCEEDED", 1, 2)
    assert ("retry", "applied", "") in run.events
    effect = ledger.effects["o-3:charge"]
    assert (effect.state, effect.dispatches) == ("SUCCEEDED", 2)


def test_an_eager_effect_on_the_database_ledger_says_it_needs_a_worker(app: Celery) -> None:
    provider = Provider()
    result = charge_task(app, provider).apply(("o-4",))
    with pytest.raises(ConfigurationError, match="side effects need a worker: an eager run"):
        result.get()
    assert "celery_deadlines.pytest_plugin" in str(result.result)
    assert provider.calls == []


def test_an_effect_of_an_app_that_turned_the_ledger_off_names_the_setting(app: Celery) -> None:
    app.conf.deadlines_ledger = False
    result = charge_task(app, Provider()).apply(("o-5",))
    with pytest.raises(ConfigurationError, match=r"turned off \(deadlines_ledger = False\)"):
        result.get()


def test_an_effect_in_a_direct_call_says_a_direct_call_claims_none(
    app: Celery, ledger: FakeLedger
) -> None:
    provider = Provider()
    with pytest.raises(ConfigurationError, match=r"a direct call \(task\(\.\.\.\)\) claims none"):
        charge_task(app, provider)("o-6")
    assert provider.calls == []
