"""The worker app of the metrics tests: ``tests.support.workerapp`` (its app and tasks)
serving its metrics on ``TEST_METRICS_PORT``, one task per pool process.

prometheus_client is imported only inside a task, so a worker started without it (the
test hides it) still loads this module.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from tests.support.workerapp import app

app.conf.update(
    deadlines_metrics_port=int(os.environ["TEST_METRICS_PORT"]),
    # every pool process runs one task, then the pool replaces it
    worker_max_tasks_per_child=1,
)

#: the gauge of the pool process this module runs in (created on first use)
_gauge: Any = None


@app.task(name="m.hold_gauge")
def hold_gauge(release_file: str, timeout: float = 30.0) -> int:
    """Set a live gauge of this pool process (prometheus_client adds its ``pid``), then
    wait until ``release_file`` exists, so that a test can scrape it while it lives."""
    global _gauge
    if _gauge is None:
        from prometheus_client import Gauge

        _gauge = Gauge(
            "test_pool_process_up", "A pool process, alive.", multiprocess_mode="liveall"
        )
    _gauge.set(1)
    deadline = time.monotonic() + timeout
    while not Path(release_file).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return os.getpid()
