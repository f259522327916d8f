"""One deadline across two services: a worker's task calls a Django service through httpx,
and the task the service publishes runs under the first task's deadline.

Two real processes on loopback, beside the test: a ``celery worker`` (the ledger app with
the tasks of tests/support/outboundapp.py, on Redis and the PostgreSQL test database)
and the service (tests/support/outbound_server.py: Django's threaded WSGI server, on a
port it picks, DeadlineMiddleware trusting the worker's address and honouring the
headers the library sends by default). A call with too little time left is refused
before it reaches the network; a service that does not answer in time is cut when the
call's time is up, and the effect ledger records that side effect as UNKNOWN.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from celery_deadlines import DeadlineRefused
from celery_deadlines.models import Effect, Run, Status
from tests.integration.conftest import LEDGER_DB, LedgerWorkers, require
from tests.support.outbound_server import serving
from tests.support.processes import Transport, WorkerProcess, read_log, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("postgres"),
    pytest.mark.django_db(transaction=True, databases=[LEDGER_DB]),
]

#: A deadline crosses the wire as float epoch seconds (x_deadline) and as an RFC 3339
#: instant to the microsecond: what two readings of one deadline may differ by.
ROUNDING = 1e-3
#: The worker's clocks and the database's, on one machine: what their readings of one
#: instant may differ by.
CLOCKS = timedelta(milliseconds=50)


@pytest.fixture
def service(
    redis_broker: Transport, queue: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[str]:
    """The Django service, publishing to the test's queue: its base URL."""
    require(redis_broker)
    log_path = tmp_path / "service.log"
    with serving({**redis_broker.env(), "TEST_QUEUE": queue}, log_path) as url:
        yield url
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(f"--- service.log ---\n{read_log(log_path)}")


@pytest.fixture
def worker(
    redis_broker: Transport, ledger_client: Any, ledger_worker: LedgerWorkers
) -> WorkerProcess:
    """A ledger worker running tests/support/outboundapp.py's tasks, ready (stopped by
    ``ledger_worker``)."""
    ledger_client(redis_broker)
    ledger_worker.app_module = "tests.support.outboundapp"
    return ledger_worker(redis_broker, concurrency=2)


def test_the_task_a_called_service_publishes_runs_under_the_callers_deadline(
    service: str, worker: WorkerProcess
) -> None:
    from tests.support import outboundapp

    # Given a task with a 30 s budget that calls the service (its own timeout: 30 s)
    result = outboundapp.call_service.apply_async((f"{service}/publish/",), budget=30)
    called = result.get(timeout=60)
    # Then the service's view ran under the caller's deadline, not its own 60 s budget
    caller = called["deadline"]
    assert called["answer"]["deadline"] == pytest.approx(caller, abs=ROUNDING)
    # And the task the view published runs under it too: one deadline, two services
    child = outboundapp.app.AsyncResult(called["answer"]["task_id"]).get(timeout=60)
    assert child["deadline"] == pytest.approx(caller, abs=ROUNDING)
    assert 0 < child["remaining"] < 30


def test_a_call_started_with_too_little_time_left_is_refused_before_any_byte_is_sent(
    worker: WorkerProcess, listener: tuple[str, Callable[[], bool]]
) -> None:
    from tests.support import outboundapp

    address, reached = listener
    # Given a task that calls once less than the call's reserve (1.5 s) is left
    result = outboundapp.call_late.apply_async((f"http://{address}/", 1.5), budget=4)
    # Then the call is refused, and the task with it
    with pytest.raises(DeadlineRefused) as refused:
        result.get(timeout=60)
    assert (refused.value.gate, refused.value.reason) == ("outbound", "insufficient_budget")
    assert refused.value.detail.startswith(f"GET {address}: ")
    # before any connection was opened
    assert not reached()
    # logged once, at WARNING, naming the task
    mentions = [
        line
        for line in worker.log().splitlines()
        if "refused at outbound gate" in line and result.id in line
    ]
    assert len(mentions) == 1, mentions
    assert "WARNING" in mentions[0]
    run = Run.objects.using(LEDGER_DB).get(task_id=result.id)
    assert (run.status, run.reason) == (Status.EXPIRED, "insufficient_budget")


def test_a_slow_service_is_cut_when_the_calls_time_is_up_and_the_effect_is_unknown(
    service: str, worker: WorkerProcess
) -> None:
    from tests.support import outboundapp

    reserve = 2.0  # what the call leaves its task, to record the outcome
    key = f"slow-{uuid.uuid4().hex[:8]}"
    # Given a side effect that calls a service which answers after a minute
    result = outboundapp.call_slow.apply_async((f"{service}/slow/", key, reserve), budget=6)

    def unknown() -> Run | None:
        return Run.objects.using(LEDGER_DB).filter(task_id=result.id, status="UNKNOWN").first()

    run = wait_for(unknown, 60)
    # Then the call was cut by its own timeout (not by the task's time limit at the deadline)
    effect = Effect.objects.using(LEDGER_DB).get(key=key)
    assert effect.state == "UNKNOWN"
    assert effect.error.startswith("ReadTimeout(")
    # when the call's time was up: the deadline less its reserve, by the ledger's clock
    assert run.deadline is not None
    assert run.deadline - timedelta(seconds=reserve) - CLOCKS <= effect.updated_at
    assert effect.updated_at <= run.deadline
    # and its caller is told UNKNOWN: after the ledger records it (never before), so
    # read once the worker has had the moment between its two writes
    assert wait_for(lambda: result.state == "UNKNOWN", 10)
