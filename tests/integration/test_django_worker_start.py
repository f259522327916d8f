"""A Django project's worker starts knowing every one of its tasks.

A worker's start runs Django's system checks (Celery's Django fixup), which import the
URLconf, and through it the views and the task modules they import: the demo's
``shop/views.py`` imports its tasks at module level, as most projects do. The library's
contract check used to load the tasks from inside those checks, which ran the checks
again, recursively, until a ``RecursionError`` left the task module half-registered: a
prefork worker that knew 2 of the shop's 9 tasks and discarded the others' messages.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from celery import Task

from tests.support.processes import REPO, Transport, kill_group, read_log, wait_for

pytestmark = pytest.mark.integration


def the_shops_tasks() -> set[str]:
    import demo_project.shop.tasks as shop

    return {task.name for task in vars(shop).values() if isinstance(task, Task)}


def test_a_prefork_worker_of_a_django_project_knows_every_task_its_views_import(
    redis: Transport, queue: str, tmp_path: Path
) -> None:
    views = REPO / "demo_project" / "shop" / "views.py"
    assert re.search(r"^from \.tasks import", views.read_text(), re.MULTILINE), (
        "the demo's views no longer import their tasks at module level: this test no "
        "longer covers the import a worker's system checks make"
    )
    # started as a user starts it: the ``celery`` script (where the recursion ended
    # depended on the stack's depth: ``python -m celery`` happened to survive it)
    celery = Path(sys.executable).with_name("celery")
    log_path = tmp_path / "worker.log"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "demo_project.settings",
        "CELERY_BROKER_URL": redis.broker_url,
        "DEMO_VAR_DIR": str(tmp_path / "var"),
        "PYTHONPYCACHEPREFIX": str(tmp_path / "pycache"),  # compiled afresh, as a new clone
    }
    with log_path.open("wb") as output:
        worker = subprocess.Popen(
            [str(celery), "-A", "demo_project", "worker", "-P", "prefork", "-c", "2",
             "-Q", queue, "-n", f"{queue}@%h", "-l", "INFO", "--without-gossip",
             "--without-mingle", "--without-heartbeat"],
            cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: " ready." in read_log(log_path) or worker.poll() is not None, 60)
    finally:
        kill_group(worker)
    log = read_log(log_path)
    listed = set(re.findall(r"^  \. (demo_project\.shop\.tasks\.\w+)$", log, re.MULTILINE))
    assert listed == the_shops_tasks(), log
    assert "celery_deadlines.W001" not in log
