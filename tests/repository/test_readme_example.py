"""The README's first example, as written: with ``max_retries=None`` its retries are
ended by the retry gate, at the deadline; without it, Celery's default of three retries
still bounds them, deadline or not."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery

from celery_deadlines import DeadlineRefused, DeadlineTask
from celery_deadlines.testing import FakeClock
from tests.support.memory_queue import drain
from tests.support.trace import execute


class ProviderDown(Exception):
    pass


class Carrier:
    def __init__(self) -> None:
        self.calls = 0

    def book(self, order_id: int, timeout: float) -> None:
        self.calls += 1
        raise ProviderDown(f"carrier down (call {self.calls})")


@pytest.fixture
def app(clock: FakeClock) -> Iterator[Celery]:
    app = Celery(f"readme-{uuid.uuid4().hex[:6]}", broker="memory://", backend="cache+memory://")
    app.conf.update(task_default_queue="readme", deadlines_ledger=False)
    drain(app, "readme")
    yield app
    app.close()


def test_the_readme_example_retries_until_the_retry_gate_ends_it_at_the_deadline(
    app: Celery, clock: FakeClock
) -> None:
    seed = random.randrange(2**32)
    print(f"jitter seed {seed}")
    random.seed(seed)  # retry_backoff's jitter
    carrier = Carrier()

    @app.task(base=DeadlineTask, bind=True, name="readme.reserve_slot", shared=False)
    def reserve_slot(self: DeadlineTask, order_id: int) -> None:
        pass

    # -- the README's example, as written ------------------------------------------------
    @app.task(  # noqa: RET503 - the example as written
        base=DeadlineTask,
        bind=True,
        budget=30,
        reserve=2,
        attempt_timeout=10,
        autoretry_for=(ProviderDown,),
        retry_backoff=True,
        max_retries=None,  # retry until the deadline (Celery's default: 3 retries)
        shared=False,
        name="readme.ship",
    )
    def ship(self: Any, order_id: int) -> Any:
        if self.remaining() < 5:  # seconds left, on the monotonic clock
            return "too late to call the carrier"
        reserve_slot.delay(order_id)  # inherits ship's deadline; can only shorten it
        carrier.book(order_id, timeout=self.remaining())

    ship.apply_async((42,), budget=60, task_id="ship-42")
    # -----------------------------------------------------------------------------------

    states = []
    while True:
        [message] = [m for m in drain(app, "readme") if m["headers"]["task"] == "readme.ship"]
        eta = message["headers"].get("eta")
        if eta:  # the retry's countdown, as Celery computed it on the real clock
            clock.advance(max((datetime.fromisoformat(eta) - datetime.now(UTC)).total_seconds(), 0))
        clock.advance(1)  # each call to the carrier takes a second to fail
        state, outcome = execute(app, message)
        states.append(state)
        if state != "RETRY":
            break
    assert states[:-1] == ["RETRY"] * (len(states) - 1)
    assert len(states) - 1 > 3  # more retries than Celery's default max_retries
    assert state == "FAILURE"
    assert isinstance(outcome, DeadlineRefused)
    assert (outcome.gate, outcome.reason) == ("retry", "retry_budget_exhausted")
    assert "last error ProviderDown" in outcome.detail
    assert carrier.calls == len(states)


def test_a_task_that_sets_max_retries_keeps_it(app: Celery, clock: FakeClock) -> None:
    @app.task(
        base=DeadlineTask,
        bind=True,
        budget=600,
        autoretry_for=(ProviderDown,),
        max_retries=1,
        shared=False,
        name="readme.limited",
    )
    def limited(self: Any) -> None:
        raise ProviderDown("down")

    limited.apply_async(task_id="limited-1")
    outcomes = []
    for _ in range(3):
        messages = drain(app, "readme")
        if not messages:
            break
        outcomes.append(execute(app, messages[0]))
    assert [state for state, _ in outcomes] == ["RETRY", "FAILURE"]
    assert isinstance(outcomes[-1][1], ProviderDown)  # Celery's own end, as configured


def test_a_task_with_no_deadline_keeps_celerys_default_of_three_retries(
    app: Celery, clock: FakeClock
) -> None:
    @app.task(base=DeadlineTask, bind=True, shared=False, name="readme.forever")
    def forever(self: Any) -> None:
        assert self.max_retries == 3
        raise self.retry(countdown=0, exc=ProviderDown("down"))

    forever.apply_async(task_id="forever-1")
    states = []
    for _ in range(6):
        messages = drain(app, "readme")
        if not messages:
            break
        states.append(execute(app, messages[0])[0])
    assert states == ["RETRY", "RETRY", "RETRY", "FAILURE"]


def test_a_task_with_a_deadline_keeps_celerys_default_of_three_retries(
    app: Celery, clock: FakeClock
) -> None:
    # a deadline only ends retries sooner: ten minutes would hold hundreds of these
    @app.task(
        base=DeadlineTask,
        bind=True,
        budget=600,
        autoretry_for=(ProviderDown,),
        shared=False,
        name="readme.bounded",
    )
    def bounded(self: Any) -> None:
        raise ProviderDown(f"down (retry {self.request.retries})")

    bounded.apply_async(task_id="bounded-1")
    outcomes = []
    for _ in range(6):
        messages = drain(app, "readme")
        if not messages:
            break
        clock.advance(1)
        outcomes.append(execute(app, messages[0]))
    assert [state for state, _ in outcomes] == ["RETRY", "RETRY", "RETRY", "FAILURE"]
    assert isinstance(outcomes[-1][1], ProviderDown)  # Celery's own end: the last error
    assert str(outcomes[-1][1]) == "down (retry 3)"
