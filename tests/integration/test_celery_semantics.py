"""Celery's own promises, kept under a default budget, on a real Redis broker and result
backend and a real ``celery worker``: the cases of Celery's integration suite (canvas
and tasks) that ``deadlines_default_budget = 300`` once replaced rather than shortened
(``make celery-integration`` runs the whole suite; these are its CI share).

Every task of ``tests.support.budgetapp`` is a DeadlineTask with a 300 s deadline from
its publish, as the suite ran them. The tests share one worker (prefork, one process,
as Celery's session worker).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from celery import chord, group, states
from celery.exceptions import TaskRevokedError

from celery_deadlines import DeadlineTask
from tests.integration.conftest import (
    Shared,
    SharedWorkers,
    client_for,
    logs_on_failure,
    redis_transport,
    require,
)
from tests.support.processes import Transport, WorkerProcess, wait_for

pytestmark = pytest.mark.integration

#: The longest a message of these tests waits for the worker (a bound for a failure,
#: never an expected duration: each test waits on an outcome).
PATIENCE = 30.0


@pytest.fixture
def budget_client(request: pytest.FixtureRequest, shared_workers: SharedWorkers) -> Iterator[Any]:
    """The budget app, publishing to the module's worker (started on first use)."""
    from tests.support import budgetapp

    def start(folder: Path, queue: str) -> tuple[Transport, WorkerProcess]:
        transport = redis_transport()
        require(transport)
        log = folder / "worker.log"
        return transport, WorkerProcess(transport, queue, log, app_module=budgetapp.__name__)

    shared: Shared = shared_workers.get("budget", start)
    with (
        logs_on_failure(request, shared.worker),
        client_for(shared.transport, shared.queue, budgetapp.app) as app,
    ):
        yield app


def test_a_default_budget_leaves_celerys_default_of_three_retries(budget_client: Any) -> None:
    from tests.support.budgetapp import ExpectedError, retry_forever

    result = retry_forever.delay(0.1)
    # Celery's max_retries (3) ends the retries with the last error, long before the
    # deadline: without it the retries would go on for 300 s
    with pytest.raises(ExpectedError, match="retry 3"):
        result.get(timeout=PATIENCE)
    assert result.state == states.FAILURE


@contextmanager
def task_events(app: Any) -> Iterator[list[dict[str, Any]]]:
    """Every task event the workers send meanwhile, received as Flower receives them."""
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    with app.connection_for_read() as connection:
        receiver = app.events.Receiver(connection, handlers={"*": seen.append})
        consuming = receiver.on_consume_ready

        def on_consume_ready(*args: Any, **kwargs: Any) -> None:
            consuming(*args, **kwargs)
            ready.set()

        receiver.on_consume_ready = on_consume_ready
        thread = threading.Thread(target=receiver.capture, kwargs={"wakeup": False}, daemon=True)
        thread.start()
        try:
            assert ready.wait(PATIENCE), "the event receiver did not start"
            yield seen
        finally:
            receiver.should_stop = True
            thread.join(PATIENCE)


def test_a_message_whose_expires_passed_under_a_default_budget_is_revoked_as_celery_revokes_it(
    budget_client: Any,
) -> None:
    from tests.support.budgetapp import add, sleeping

    with task_events(budget_client) as events:
        # Celery's test_expired: the worker's only process is busy for 3 s, far beyond
        # the message's 1 s expires, which is its deadline (earlier than the 300 s)
        busy = [sleeping.delay(1.5) for _ in range(2)]
        result = add.apply_async((1, 1), expires=1)
        with pytest.raises(TaskRevokedError, match="expired"):
            result.get(timeout=PATIENCE)
        assert str(result.status) == states.REVOKED
        assert (result.ready(), result.failed(), result.successful()) == (True, False, False)
        assert [r.get(timeout=PATIENCE) for r in busy] == [1.5, 1.5]
        revoked = wait_for(
            lambda: [e for e in events if e["uuid"] == result.id and e["type"] == "task-revoked"],
            PATIENCE,
        )
    assert [(e["expired"], e["terminated"]) for e in revoked] == [(True, False)]
    assert not [e for e in events if e["uuid"] == result.id and e["type"] == "task-failed"]


@pytest.mark.parametrize("canvas", ["chord", "group"])
def test_a_generator_header_under_a_default_budget_is_published_as_it_yields(
    budget_client: Any, tmp_path: Path, canvas: str
) -> None:
    from tests.support.budgetapp import DEFAULT_BUDGET, tsum, write_to_file_and_return_int

    # Celery's test_generator, without its sleeps: before yielding its last member the
    # generator waits until the worker has run the first, which only a header published
    # as it yields lets happen (celery#3021)
    written = tmp_path / "written"
    written.touch()
    size = 4

    def header() -> Iterator[Any]:
        for i in range(size):
            if i == size - 1:
                try:
                    wait_for(lambda: written.read_text().startswith("0\n"), PATIENCE)
                except TimeoutError:
                    pytest.fail("the header was unrolled too early: nothing ran meanwhile")
            yield write_to_file_and_return_int.s(str(written), i)

    # the premise: every member is a DeadlineTask with the default budget's deadline
    assert isinstance(write_to_file_and_return_int, DeadlineTask)
    assert budget_client.conf.deadlines_default_budget == DEFAULT_BUDGET
    if canvas == "chord":
        assert chord(header(), tsum.s())().get(timeout=PATIENCE) == size * (size - 1) // 2
    else:
        assert group(header())().get(timeout=PATIENCE) == list(range(size))
    assert written.read_text().splitlines() == [str(i) for i in range(size)]
