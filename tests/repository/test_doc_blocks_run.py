"""The doc blocks that do something at their top level (publish a task, wait for a
result, serve metrics) run as written, against Redis and a real ``celery worker``.

tests/repository/test_doc_blocks.py parses every block, checks its imports and runs the
settings and definition blocks; tests/repository/test_quickstart.py follows the quick
start's page. The blocks left run here, each in a namespace where the reader's own
objects (``STAND_INS``) are real: the project's app is the integration tests' app on
Redis, the shop's tasks are tasks a real worker runs, ``result`` is a call that worker
refused. Whatever a block publishes is watched on its way out: every message it sends
carries a deadline.
"""

from __future__ import annotations

import ast
import logging
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from celery import Celery
from celery import _state as celery_state
from celery.result import AsyncResult
from celery.signals import before_task_publish

from celery_deadlines import DEADLINE_HEADER, DeadlineRefused
from tests.integration.conftest import (
    client_for,
    forget_unacked,
    redis_transport,
    require,
)
from tests.repository.test_doc_blocks import (
    BLOCKS,
    STAND_INS,
    Block,
    is_settings,
    only_definitions,
)
from tests.support.processes import WorkerProcess

pytestmark = pytest.mark.integration


def runs_something(block: Block) -> bool:
    tree = ast.parse(block.code)
    return not (block.fragment or is_settings(tree) or only_definitions(tree))


#: The quick start's blocks belong to its project: test_quickstart.py runs them there.
RUN_HERE = [b for b in BLOCKS if runs_something(b) and b.page != "quickstart.md"]
#: A block that sets up something for the whole process (a metrics server that outlives
#: it, the tracer provider OpenTelemetry lets a process set once) runs in a process of its
#: own, followed by code that checks it did: the scrape of the metrics, a span exported.
OWN_PROCESS = {
    "prometheus.serve": (
        "\nimport urllib.request\n"
        "print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics').read().decode())\n",
        "celery_deadlines_refusals",
    ),
    "set_tracer_provider": (
        "\ninstrument()\n"
        "with trace.get_tracer('docs').start_as_current_span('docs-probe'):\n"
        "    pass\n"
        "tracer_provider.force_flush()\n",
        '"name": "docs-probe"',
    ),
}
PROCESS_BLOCKS = [b for b in RUN_HERE if any(marker in b.code for marker in OWN_PROCESS)]
#: A block that writes in a transaction needs the database.
PARAMS = [
    pytest.param(b, id=str(b), marks=[pytest.mark.django_db] if "transaction" in b.code else [])
    for b in RUN_HERE
    if b not in PROCESS_BLOCKS
]


@pytest.fixture(scope="module")
def docs_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, WorkerProcess]]:
    """The reader's app on Redis, and one worker running its tasks one at a time."""
    transport = redis_transport()
    require(transport)
    queue = f"docs-{uuid.uuid4().hex[:10]}"
    folder = tmp_path_factory.mktemp("docs-blocks")
    worker = WorkerProcess(transport, queue, folder / "worker.log", pool="solo").start()
    try:
        with client_for(transport, queue) as app:
            # finalized now, with Celery's built-in tasks: finalized inside a block's run,
            # while only the block's tasks may be added to an app, it would lack them
            # (celery.chord_unlock: a later chord test on this process failed)
            app.finalize(auto=True)
            yield app, worker
    finally:
        worker.kill()
        forget_unacked(transport.broker_url, queue)


@pytest.fixture(scope="module")
def refused(docs_app: tuple[Any, WorkerProcess]) -> AsyncResult[Any]:
    """A call the worker refused: 0.5 s of budget behind 1.5 s of other work."""
    from tests.support.workerapp import docs_charge, sleeper

    sleeper.delay(1.5)
    late: AsyncResult[Any] = docs_charge.apply_async((7,), budget=0.5)
    with pytest.raises(DeadlineRefused):
        late.get(timeout=60)
    return late


def scratch_app(block: Block, app: Any) -> Celery:
    """The reader's app for one block: a new app (the tasks a block defines are its own,
    as in the reader's project) that publishes where ``app`` does."""
    scratch = Celery(re.sub(r"\W", "_", f"docs_{block}"), set_as_current=False)
    scratch.conf.update({key: app.conf[key] for key in SHARED_CONFIGURATION})
    return scratch


@contextmanager
def only_its_own_tasks(app: Celery) -> Iterator[None]:
    """``app.task`` and ``shared_task`` add a task to every app finalized later (and
    ``shared_task`` to every live one): while a block runs, its app gets the block's
    tasks and no others, and no other app gets them."""
    registered: set[Any] = celery_state._on_app_finalizers  # type: ignore[attr-defined]
    before = set(registered)
    registered.clear()
    try:
        with mock.patch.object(celery_state, "_get_active_apps", return_value=[app]):
            yield
    finally:
        registered.clear()
        registered.update(before)


#: What a block's app takes from the tests' app: where and how it publishes.
SHARED_CONFIGURATION = (
    "broker_url",
    "result_backend",
    "task_default_queue",
    "task_serializer",
    "result_serializer",
    "accept_content",
    "result_extended",
    "deadlines_ledger",
)


def namespace_for(block: Block, app: Any, refused: AsyncResult[Any]) -> dict[str, Any]:
    from tests.support.workerapp import docs_charge, docs_fetch, docs_merge, docs_ship

    order = SimpleNamespace(id=42, pk=42)
    namespace: dict[str, Any] = {name: mock.MagicMock(name=name) for name in STAND_INS}
    namespace.update(
        __name__=re.sub(r"\W", "_", f"docs_{block}"),  # the module of the tasks it defines
        app=scratch_app(block, app),
        result=refused,
        request_deadline=datetime.now(UTC) + timedelta(minutes=1),
        ProviderDown=type("ProviderDown", (Exception,), {}),
        Order=SimpleNamespace(objects=SimpleNamespace(create=lambda *args, **kwargs: order)),
        order=order,
        urls=["https://example.com/a", "https://example.com/b"],
        log=logging.getLogger("docs"),
        fetch=docs_fetch,
        merge=docs_merge,
        charge=docs_charge,
        ship=docs_ship,
    )
    return namespace


@pytest.mark.parametrize("block", PARAMS)
def test_a_doc_block_that_calls_things_runs_against_a_real_broker_and_worker(
    block: Block, docs_app: tuple[Any, WorkerProcess], refused: AsyncResult[Any]
) -> None:
    app, worker = docs_app
    published: list[tuple[str, object]] = []

    def watch(sender: str, headers: dict[str, Any], **_: Any) -> None:
        published.append((sender, headers.get(DEADLINE_HEADER)))

    namespace = namespace_for(block, app, refused)
    before_task_publish.connect(watch, weak=False)
    try:
        with only_its_own_tasks(namespace["app"]):
            exec(compile(block.code, str(block), "exec"), namespace)
    except BaseException:
        print(worker.log())
        raise
    finally:
        before_task_publish.disconnect(watch)
    without = [name for name, deadline in published if deadline is None]
    assert without == [], f"{block} published without a deadline: {without}"
    if "deadline_scope" in block.code:  # "one deadline for all of it"
        assert len({deadline for _, deadline in published}) == 1, published


def test_every_doc_block_that_calls_things_is_judged_by_a_runner() -> None:
    """What the runners here can judge: a block publishes (and is watched), reads a
    result, or is one of ``OWN_PROCESS``; a new kind of block needs a new check here."""
    kinds = re.compile(r"\.delay\(|\.apply_async\(|send_task\(|chord\(|result\.")
    judged = [b for b in RUN_HERE if kinds.search(b.code) or b in PROCESS_BLOCKS]
    assert [str(b) for b in RUN_HERE if b not in judged] == []


@pytest.mark.parametrize("block", PROCESS_BLOCKS, ids=str)
def test_a_block_that_sets_up_its_process_does_what_it_says(block: Block) -> None:
    [(check, expected)] = [check for marker, check in OWN_PROCESS.items() if marker in block.code]
    port = re.search(r"serve\((\d+)\)", block.code)
    code = block.code + check.replace("{port}", port[1] if port else "")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout
