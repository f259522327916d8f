"""A prefork pool process's result pipe against a real ``celery worker``: a message its
main process cannot unpickle is dropped, and the worker goes on
(:mod:`celery_deadlines.core.resultpipes`).

Celery lets the ``UnpicklingError`` out of its event loop and the worker stops
("Unrecoverable error"). The overload benchmark's ledger worker did, when pool
processes were killed at their deadline's cap while the main process was in the middle
of reading their ``READY``: the rest of the pipe, read from the middle of a message,
is no pickle. The task below writes such a message itself.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import workerapp
from tests.support.processes import Transport, wait_for

pytestmark = pytest.mark.integration


def test_a_message_that_cannot_be_unpickled_does_not_stop_the_worker(
    redis: Transport, redis_client: Any, start_worker: Any
) -> None:
    """The torn message is dropped and logged, the pool process that wrote it is
    replaced (its job lost), and the worker's main process runs the next job."""
    worker = start_worker(redis)
    torn = workerapp.tear_result_pipe.delay()
    wait_for(lambda: "dropped a message from pool process" in worker.log(), 20)
    assert workerapp.sleeper.delay(0.01).get(timeout=20) == 0.01
    assert worker.process.poll() is None, worker.log()
    assert "Unrecoverable error" not in worker.log()
    # the job whose pipe was torn is lost with its process, as when one is killed
    with pytest.raises(Exception, match=r"WorkerLostError|exited prematurely"):
        torn.get(timeout=20)
