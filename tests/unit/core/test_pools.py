"""Whether a process runs its attempts one at a time: what lets a won claim commit
without waiting for the disk (celery_deadlines.core.pools, docs/explanation/run-ledger.md,
"Claim")."""

from __future__ import annotations

import threading
import uuid
import weakref
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.app.task import Context

from celery_deadlines.core import claiming, pools
from celery_deadlines.testing import FakeClock, FakeLedger, use_ledger


@pytest.fixture(autouse=True)
def unmarked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pools, "_one_at_a_time", False)


def in_another_thread() -> bool:
    seen: list[bool] = []
    thread = threading.Thread(target=lambda: seen.append(pools.one_attempt_at_a_time()))
    thread.start()
    thread.join()
    return seen[0]


def test_a_prefork_pool_process_runs_one_attempt_at_a_time_on_its_main_thread_only() -> None:
    assert not pools.one_attempt_at_a_time()  # a worker's main process, a producer
    pools._in_a_pool_process()  # worker_process_init, in a prefork pool process
    assert pools.one_attempt_at_a_time()
    assert not in_another_thread()


@pytest.mark.parametrize(
    ("pool", "alone"),
    [("solo", True), ("prefork", False), ("threads", False), ("nope", False)],
)
def test_a_solo_worker_runs_one_attempt_at_a_time_and_no_other_pool_does_in_its_main_process(
    pool: str, alone: bool
) -> None:
    pools._in_a_worker(sender=SimpleNamespace(pool_cls=pool))  # worker_init
    assert pools.one_attempt_at_a_time() is alone


def test_install_connects_both_worker_signals() -> None:
    from celery.signals import worker_init, worker_process_init

    from celery_deadlines.install import install

    def connected(signal: Any) -> list[Any]:  # a receiver connected weak=False is kept as is
        return [r() if isinstance(r, weakref.ref) else r for _, r in signal.receivers]

    install()
    assert pools._in_a_pool_process in connected(worker_process_init)
    assert pools._in_a_worker in connected(worker_init)
    assert not pools.one_attempt_at_a_time()  # connecting marks nothing


@pytest.fixture
def ledger() -> Iterator[FakeLedger]:
    with use_ledger(FakeLedger()) as fake:
        yield fake


def test_the_claim_tells_the_ledger_whether_its_owner_runs_one_attempt_at_a_time(
    ledger: FakeLedger, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = Celery(f"pools-{uuid.uuid4().hex[:6]}", broker="memory://", backend="cache+memory://")
    told: list[bool] = []
    claim_run = ledger.claim_run

    def recorded(*args: Any, exclusive: bool = False, **kwargs: Any) -> Any:
        told.append(exclusive)
        return claim_run(*args, exclusive=exclusive, **kwargs)

    monkeypatch.setattr(ledger, "claim_run", recorded)

    def claim(task_id: str) -> None:
        caller = claiming.ResultPolicy(
            app=app, backend=app.backend, task_name="pools.work", stores_errors=True,
            ignores_result=False,
        )  # fmt: skip
        claiming.claim(
            claiming.Claim(
                policy=caller, sender=None, task_id=task_id,
                request=Context(id=task_id, retries=0, hostname="w1@test", args=[], kwargs={}),
                deadline=clock.now() + timedelta(minutes=1), lease=timedelta(seconds=30),
                reserve=timedelta(seconds=1), serializer="json", requeue=True,
            )
        )  # fmt: skip

    claim("shared")
    pools.mark_one_attempt_at_a_time()
    claim("alone")
    assert told == [False, True]
    app.close()
