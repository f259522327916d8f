"""A DeadlineTask's malformed message against a real prefork ``celery worker``: refused
with ``invalid_message``, acknowledged, its refusal stored where its id can name a
result, and the worker still consuming after it, its main and pool processes the same.

Each message is published raw (kombu's ``Producer``), its headers exactly as written:
no client of Celery's would write them. After each, a well-formed message is published
and must run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kombu import Producer

from celery_deadlines import DEADLINE_HEADER, DeadlineRefused
from tests.integration.conftest import (
    LEDGER_DB,
    Shared,
    SharedWorkers,
    client_for,
    logs_on_failure,
    require,
    transport_named,
)
from tests.support.processes import Transport, WorkerProcess, wait_for

pytestmark = pytest.mark.integration

ABSENT = object()
#: The body Celery writes for a call without arguments.
BODY: tuple[Any, ...] = (
    (),
    {},
    {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
)
#: What each malformed message carries (over Celery's own headers and body), and whether
#: its deadline has passed (else it is a minute away). A passed deadline made the
#: worker store the claim gate's refusal in its main process.
CASES: dict[str, tuple[dict[str, Any], Any, bool]] = {
    "id-int": ({"id": 5}, BODY, True),
    "id-null": ({"id": None}, BODY, True),
    "id-list": ({"id": [1]}, BODY, False),
    "id-empty": ({"id": ""}, BODY, True),
    "id-absent": ({"id": ABSENT}, BODY, False),
    "timelimit-strings": ({"timelimit": ["x", "y"]}, BODY, False),
    "timelimit-int": ({"timelimit": 5}, BODY, False),
    "retries-string": ({"retries": "x"}, BODY, False),
    "shadow-list": ({"shadow": [1]}, BODY, False),
    "stamped-headers-int": ({"stamped_headers": 5}, BODY, False),
    "eta-unreadable": ({"eta": "soon"}, BODY, False),
    "body-string": ({}, "x", False),
    "embed-int": ({}, ((), {}, 5), True),
    "errbacks-int": ({}, ((), {}, {"errbacks": 5}), True),
}


def publish_raw(
    app: Any, queue: str, task_name: str, fields: dict[str, Any], body: Any, passed: bool
) -> str:
    """Publish a message of ``task_name`` with Celery's headers and ``fields`` over them
    (``ABSENT``: left out), exactly as given; returns the id Celery's headers had."""
    task_id = str(uuid.uuid4())
    message = app.amqp.as_task_v2(task_id, task_name, (), {})
    offset = -5 if passed else 60
    deadline = (datetime.now(UTC) + timedelta(seconds=offset)).timestamp()
    headers = {**message.headers, DEADLINE_HEADER: deadline, **fields}
    headers = {key: value for key, value in headers.items() if value is not ABSENT}
    with app.connection_for_write() as connection:
        Producer(connection).publish(
            body,
            routing_key=queue,
            exchange="",
            serializer="json",
            headers=headers,
            correlation_id=task_id,
        )
    return task_id


def pool_of(worker: WorkerProcess) -> set[int]:
    """The pids of the worker's pool processes (its main process's children)."""
    assert worker.process is not None
    found: set[int] = set()
    for thread in Path(f"/proc/{worker.process.pid}/task").iterdir():
        children = (thread / "children").read_text().split()
        found.update(int(pid) for pid in children)
    return found


def refusal_lines(worker: WorkerProcess, offset: int) -> list[str]:
    return [
        line
        for line in worker.log()[offset:].splitlines()
        if "refused at claim gate: invalid_message" in line
    ]


def assert_refused_and_still_consuming(
    app: Any, worker: WorkerProcess, probe: Any, task_id: str, case: str, offset: int
) -> None:
    """The malformed message was refused once (stored when its id can name a result),
    and a well-formed one runs on the same processes."""
    fields = CASES[case][0]
    if isinstance(fields.get("id", task_id), str) and fields.get("id", task_id):
        with pytest.raises(DeadlineRefused) as raised:
            app.AsyncResult(task_id).get(timeout=20)
        assert (raised.value.gate, raised.value.reason) == ("claim", "invalid_message")
    good = probe.apply_async(("good",), budget=30)
    assert good.get(timeout=20)["label"] == "good"
    lines = wait_for(lambda: refusal_lines(worker, offset), timeout=10)
    assert len(lines) == 1  # logged once
    assert worker.process is not None
    assert worker.process.poll() is None


@pytest.fixture(params=["redis", "rabbitmq"])
def shared(request: pytest.FixtureRequest, shared_workers: SharedWorkers) -> Iterator[Shared]:
    """The module's prefork worker (two pool processes) on each transport."""

    def start(folder: Path, queue: str) -> tuple[Transport, WorkerProcess]:
        transport = transport_named(request.param, folder)
        require(transport)
        return transport, WorkerProcess(transport, queue, folder / "worker.log", concurrency=2)

    chosen = shared_workers.get(request.param, start)
    with logs_on_failure(request, chosen.worker):
        yield chosen


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_message_is_refused_and_the_worker_keeps_consuming(
    shared: Shared, case: str
) -> None:
    from tests.support.workerapp import probe

    worker = shared.worker
    assert worker.process is not None
    main = worker.process.pid
    pool = wait_for(lambda: len(pool_of(worker)) == 2 and pool_of(worker), timeout=20)
    fields, body, passed = CASES[case]
    offset = len(worker.log())
    with client_for(shared.transport, shared.queue) as app:
        task_id = publish_raw(app, shared.queue, "t.probe", fields, body, passed)
        assert_refused_and_still_consuming(app, worker, probe, task_id, case, offset)
    assert worker.process.pid == main
    assert pool_of(worker) == pool  # no pool process died and was replaced


# -- with the run ledger ----------------------------------------------------------------


@pytest.mark.usefixtures("postgres")
@pytest.mark.django_db(transaction=True, databases=[LEDGER_DB])
def test_with_the_ledger_a_malformed_message_ends_only_the_run_its_id_and_retries_name(
    redis: Transport, ledger_client: Any, ledger_worker: Any, queue: str
) -> None:
    # Before: a retries of another type failed the pool process's claim with a raw
    # ValueError (int("x")), one beyond PostgreSQL's integer with a DataError, and a
    # timelimit of strings stopped the worker
    from celery_deadlines.models import Run

    tasks = ledger_client(redis)
    worker = ledger_worker(redis, concurrency=2)
    assert worker.process is not None
    main = worker.process.pid
    pool = wait_for(lambda: len(pool_of(worker)) == 2 and pool_of(worker), timeout=20)
    offset = len(worker.log())
    app = tasks.app
    malformed: dict[str, dict[str, Any]] = {
        "retries-string": {"retries": "x"},
        "retries-beyond-the-column": {"retries": 2**31},
        "timelimit-strings": {"timelimit": ["x", "y"]},
    }
    refused = {
        name: publish_raw(app, queue, "l.effect", fields, ((f"k-{name}",), {}, None), False)
        for name, fields in malformed.items()
    }
    # a root_id beyond the ledger's column, on a message published by name (no row yet):
    # before, the claim's row rebuilt from the request failed with a DataError
    linked = publish_raw(
        app, queue, "l.effect", {"root_id": "r" * 300}, (("k-linked",), {}, None), False
    )
    assert app.AsyncResult(linked).get(timeout=30)["key"] == "k-linked"
    assert Run.objects.using(LEDGER_DB).get(task_id=linked).root_id == linked  # not kept
    good = tasks.effect.apply_async(("k-good",), budget=30)
    assert good.get(timeout=30)["key"] == "k-good"
    # the run a well-formed id and attempt name is ended, its refusal stored
    with pytest.raises(DeadlineRefused) as raised:
        app.AsyncResult(refused["timelimit-strings"]).get(timeout=20)
    assert raised.value.reason == "invalid_message"
    run = Run.objects.using(LEDGER_DB).get(task_id=refused["timelimit-strings"])
    assert (run.status, run.reason) == ("EXPIRED", "invalid_message")
    # a retries that names no attempt ends no run, and stores nothing
    for name in ("retries-string", "retries-beyond-the-column"):
        assert not Run.objects.using(LEDGER_DB).filter(task_id=refused[name]).exists()
        assert app.AsyncResult(refused[name]).state == "PENDING"
    wait_for(lambda: len(refusal_lines(worker, offset)) == 3, timeout=10)  # once each
    assert worker.process.poll() is None
    assert worker.process.pid == main
    assert pool_of(worker) == pool


@pytest.mark.parametrize("name", [["t.probe"], {"t": "probe"}], ids=["list", "dict"])
def test_a_task_name_no_task_can_have_is_an_unknown_task_and_the_worker_keeps_consuming(
    shared: Shared, name: Any
) -> None:
    # Celery's consumer looks the name up in its table of strategies: an unhashable one
    # raised TypeError there, and the worker stopped on it
    from celery.exceptions import NotRegistered

    from tests.support.workerapp import probe

    worker = shared.worker
    assert worker.process is not None
    main = worker.process.pid
    pool = wait_for(lambda: len(pool_of(worker)) == 2 and pool_of(worker), timeout=20)
    with client_for(shared.transport, shared.queue) as app:
        task_id = publish_raw(app, shared.queue, "t.probe", {"task": name}, BODY, False)
        with pytest.raises(NotRegistered):
            app.AsyncResult(task_id).get(timeout=20)  # as Celery tells an unknown task
        good = probe.apply_async(("good",), budget=30)
        assert good.get(timeout=20)["label"] == "good"
    assert worker.process.poll() is None
    assert worker.process.pid == main
    assert pool_of(worker) == pool
