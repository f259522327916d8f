"""A producer process that serves its own metrics (``metrics.serve``) and makes calls to
other services outside any task: ``python -m tests.support.metricsproducer PORT COUNT
DONE_FILE``.

Each of its COUNT calls goes to a host of its own, through requests' ``DeadlineAdapter``,
inside a deadline scope whose deadline has passed: the outbound gate refuses each
(``deadline_passed``) before anything is sent (no name is looked up, no connection
opened). It then writes DONE_FILE and serves its metrics until it is killed.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import requests
from celery import Celery

from celery_deadlines import DeadlineRefused, deadline_scope
from celery_deadlines.contrib import prometheus as metrics
from celery_deadlines.contrib.requests import DeadlineAdapter


def main(port: int, count: int, done: Path) -> None:
    app = Celery("metricsproducer", set_as_current=False)
    metrics.serve(port)
    session = requests.Session()
    session.mount("http://", DeadlineAdapter(app=app))
    refused = 0
    with deadline_scope(deadline=datetime.now(UTC) - timedelta(seconds=1), app=app):
        for n in range(count):
            try:
                session.get(f"http://host-{n}.example/")
            except DeadlineRefused:
                refused += 1
    done.write_text(str(refused))
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
