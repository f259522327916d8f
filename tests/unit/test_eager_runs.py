"""Eager runs (``apply()``, ``task_always_eager``) of a body that calls ``self.effect``,
against the in-memory ledger a test installs (``use_ledger(FakeLedger())``, or the
pytest plugin), which claims them as the database's ledger does
(tests/django/test_eager_runs.py): the effect runs once per key, an eager retry is
handed its run as a worker's retry message is, a second call with the same task id is
told the run's outcome, and a refusal is raised as Celery raises an eager failure.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Retry

from celery_deadlines import (
    DEADLINE_HEADER,
    ConfigurationError,
    DeadlineRefused,
    DeadlineTask,
    RunFailed,
)
from celery_deadlines.rules.wire import encode
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


@pytest.mark.parametrize("always_eager", [True, False], ids=["delay", "apply"])
def test_a_second_eager_call_with_the_same_task_id_is_told_the_run_and_charges_nothing(
    app: Celery, ledger: FakeLedger, always_eager: bool
) -> None:
    app.conf.task_always_eager = always_eager
    provider = Provider()
    charge = charge_task(app, provider)
    call = charge.apply_async if always_eager else charge.apply
    first = call(("o-7",), task_id="r-7")
    again = call(("o-7",), task_id="r-7")
    assert (again.state, again.get()) == ("SUCCESS", first.get())
    assert provider.calls == ["o-7"]
    run = ledger.run("r-7")
    assert (run.status, run.attempt) == ("SUCCEEDED", 1)
    assert ("claim", "rejected", "terminal") in run.events


def test_a_second_eager_call_of_a_failed_run_is_told_its_failure(
    app: Celery, ledger: FakeLedger
) -> None:
    calls: list[str] = []

    @app.task(base=DeadlineTask, bind=True, name="eager.broken", budget=60, shared=False)
    def broken(self: DeadlineTask) -> None:
        calls.append(self.request.id)
        raise ValueError("no price")

    assert isinstance(broken.apply(task_id="r-8").result, ValueError)
    again = broken.apply(task_id="r-8")
    assert again.state == "FAILURE"
    with pytest.raises(RunFailed, match="no price"):
        again.get()
    assert calls == ["r-8"]


@pytest.mark.parametrize("propagates", [False, True], ids=["stored", "propagated"])
def test_an_eager_attempt_past_its_deadline_is_refused_with_deadline_refused(
    app: Celery, ledger: FakeLedger, clock: FakeClock, propagates: bool
) -> None:
    app.conf.task_eager_propagates = propagates
    provider = Provider()
    late = {DEADLINE_HEADER: encode(clock.now() - timedelta(seconds=1))}
    charge = charge_task(app, provider)
    if propagates:
        with pytest.raises(DeadlineRefused, match="attempt gate refused: deadline_passed"):
            charge.apply(("o-9",), task_id="r-9", headers=late)
    else:
        result = charge.apply(("o-9",), task_id="r-9", headers=late)
        assert result.state == "FAILURE"
        with pytest.raises(DeadlineRefused, match="attempt gate refused: deadline_passed"):
            result.get()
    assert provider.calls == []
    assert (ledger.run("r-9").status, ledger.run("r-9").reason) == ("EXPIRED", "deadline_passed")


def test_without_a_ledger_an_eager_attempt_past_its_deadline_is_refused_the_same(
    app: Celery, clock: FakeClock
) -> None:
    app.conf.deadlines_ledger = False
    provider = Provider()
    late = {DEADLINE_HEADER: encode(clock.now() - timedelta(seconds=1))}
    result = charge_task(app, provider).apply(("o-10",), headers=late)
    assert result.state == "FAILURE"
    with pytest.raises(DeadlineRefused, match="attempt gate refused: deadline_passed"):
        result.get()


def test_with_eager_propagates_a_raised_retry_ends_the_run_with_it(
    app: Celery, ledger: FakeLedger
) -> None:
    app.conf.task_eager_propagates = True
    provider = Provider(unreachable=1)
    with pytest.raises(Retry):  # Celery raises it to the caller and runs no retry
        charge_task(app, provider).apply(("o-11",), task_id="r-11")
    assert provider.calls == []
    run = ledger.run("r-11")
    assert (run.status, run.reason, run.retries) == ("FAILED", "error", 0)
    assert ledger.effects["o-11:charge"].state == "NOT_DISPATCHED"
