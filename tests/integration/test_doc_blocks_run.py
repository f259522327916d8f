"""The doc blocks that do something at their top level (publish a task, wait for a
result, serve metrics) run as written, against Redis and a real ``celery worker``.

tests/unit/test_doc_blocks.py parses every block, checks its imports and runs the
settings and definition blocks; tests/integration/test_quickstart.py follows the quick
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
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from celery.result import AsyncResult
from celery.signals import before_task_publish

from celery_deadlines import DEADLINE_HEADER, DeadlineRefused
from tests.integration.conftest import (
    client_for,
    forget_unacked,
    redis_transport,
    require,
)
from tests.support.processes import WorkerProcess
from tests.unit.test_doc_blocks import (
    BLOCKS,
    STAND_INS,
    Block,
    is_settings,
    only_definitions,
)

pytestmark = pytest.mark.integration


def runs_something(block: Block) -> bool:
    tree = ast.parse(block.code)
    return not (block.fragment or is_settings(tree) or only_definitions(tree))


#: The quick start's blocks belong to its project: test_quickstart.py runs them there.
RUN_HERE = [b for b in BLOCKS if runs_something(b) and b.page != "quickstart.md"]
#: A block that serves metrics runs in a process of its own (the server outlives it).
METRICS_BLOCKS = [b for b in RUN_HERE if "metrics.serve" in b.code]
#: A block that writes in a transaction needs the database.
PARAMS = [
    pytest.param(b, id=str(b), marks=[pytest.mark.django_db] if "transaction" in b.code else [])
    for b in RUN_HERE
    if b not in METRICS_BLOCKS
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


def namespace_for(block: Block, app: Any, refused: AsyncResult[Any]) -> dict[str, Any]:
    from tests.support.workerapp import docs_charge, docs_fetch, docs_merge, docs_ship

    order = SimpleNamespace(id=42, pk=42)
    namespace: dict[str, Any] = {name: mock.MagicMock(name=name) for name in STAND_INS}
    namespace.update(
        __name__=re.sub(r"\W", "_", f"docs_{block}"),  # the module of the tasks it defines
        app=app,
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

    before_task_publish.connect(watch, weak=False)
    try:
        exec(compile(block.code, str(block), "exec"), namespace_for(block, app, refused))
    except BaseException:
        print(worker.log())
        raise
    finally:
        before_task_publish.disconnect(watch)
    without = [name for name, deadline in published if deadline is None]
    assert without == [], f"{block} published without a deadline: {without}"
    if "deadline_scope" in block.code:  # "one deadline for all of it"
        assert len({deadline for _, deadline in published}) == 1, published


def test_every_doc_block_that_calls_things_publishes_or_reads_a_result() -> None:
    """What the runner above can judge: a block it runs publishes (and is watched), reads
    a result, or serves metrics; a new kind of block needs a new check here."""
    kinds = re.compile(r"\.delay\(|\.apply_async\(|send_task\(|chord\(|result\.|metrics\.serve")
    assert [str(b) for b in RUN_HERE if not kinds.search(b.code)] == []


@pytest.mark.parametrize("block", METRICS_BLOCKS, ids=str)
def test_the_metrics_block_serves_the_metrics(block: Block) -> None:
    port = re.search(r"serve\((\d+)\)", block.code)
    assert port is not None
    scrape = (
        "\nimport urllib.request\n"
        f"print(urllib.request.urlopen('http://127.0.0.1:{port[1]}/metrics').read().decode())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", block.code + scrape], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "celery_deadlines_refusals" in done.stdout
