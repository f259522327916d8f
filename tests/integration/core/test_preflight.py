"""A worker and beat refuse to start on a setting ``manage.py check`` rejects.

A ``celery worker`` started with ``CELERY_DEADLINES_LEASE_TTL = "30s"`` (E001) used to
start, take every DeadlineTask's message and fail it with a ConfigurationError; the
ledger expired the runs later as deadline_passed. Now the worker, and beat, exit with
status 1 before taking or sending anything, writing the error as the check writes it:
the setting in both spellings, what it must be, the hint. Real ``celery worker`` and
``celery beat`` processes of a project written to a folder of its own, configured as
a Django project (``CELERY_DEADLINES_*`` in its settings, read with
``namespace="CELERY"``) or as a plain Celery app (``app.conf.deadlines_*``). Once the
setting is fixed the same project starts: the worker is ready, beat sends its tasks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core import checks
from django.test import override_settings

from celery_deadlines.checks import check_settings
from tests.support.processes import Transport, kill_group, read_log, wait_for

pytestmark = pytest.mark.integration

#: How long a process may take to start or to exit on a busy machine.
START_TIMEOUT = 90

PLAIN_APP = """\
from celery import Celery

from celery_deadlines import DeadlineTask

app = Celery("proj", broker={broker!r})
app.conf.update(
    task_default_queue={queue!r},
    broker_connection_retry_on_startup=True,
    beat_schedule={{"tick": {{"task": "proj.tick", "schedule": 1.0}}}},
    deadlines_lease_ttl={value!r},
)


@app.task(base=DeadlineTask, name="proj.tick", budget=60)
def tick() -> None:
    pass
"""

DJANGO_SETTINGS = """\
SECRET_KEY = "tests-only"
USE_TZ = True
INSTALLED_APPS = ["celery_deadlines", "shop"]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {database!r}}}}}
CELERY_BROKER_URL = {broker!r}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = {queue!r}
CELERY_BEAT_SCHEDULE = {{"tick": {{"task": "shop.tasks.tick", "schedule": 1.0}}}}
CELERY_DEADLINES_LEASE_TTL = {value!r}
"""

DJANGO_CELERY = """\
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
"""

DJANGO_TASKS = """\
from celery import shared_task

from celery_deadlines import DeadlineTask


@shared_task(base=DeadlineTask, budget=60)
def tick() -> None:
    pass
"""


def write_project(root: Path, kind: str, broker: str, queue: str, value: object) -> None:
    """The project, with ``deadlines_lease_ttl`` set to ``value`` as its kind sets it."""
    if kind == "plain":
        (root / "proj.py").write_text(PLAIN_APP.format(broker=broker, queue=queue, value=value))
        return
    (root / "proj").mkdir(exist_ok=True)
    (root / "shop").mkdir(exist_ok=True)
    (root / "proj" / "__init__.py").write_text("from .celery import app as celery_app\n")
    (root / "proj" / "celery.py").write_text(DJANGO_CELERY)
    (root / "proj" / "settings.py").write_text(
        DJANGO_SETTINGS.format(
            database=str(root / "db.sqlite3"), broker=broker, queue=queue, value=value
        )
    )
    (root / "shop" / "__init__.py").write_text("")
    (root / "shop" / "tasks.py").write_text(DJANGO_TASKS)


def project_env(root: Path, kind: str) -> dict[str, str]:
    """The environment of the project's processes: a plain project has no Django settings."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return {**env, "DJANGO_SETTINGS_MODULE": "proj.settings"} if kind == "django" else env


def start(root: Path, kind: str, program: str, log: Path) -> subprocess.Popen[bytes]:
    """``celery -A proj worker`` (or ``beat``) in the project's folder, as its user runs it."""
    arguments = {
        "worker": ["worker", "-P", "solo", "-l", "INFO", "--without-gossip",
                   "--without-mingle", "--without-heartbeat"],
        "beat": ["beat", "-l", "INFO", "-s", str(root / "beat-schedule"),
                 "--max-interval", "1"],
    }[program]  # fmt: skip
    env = project_env(root, kind)
    with log.open("wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "proj", *arguments],
            cwd=root, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


#: What each program logs once it has started: it took or sent work.
STARTED = {"worker": " ready.", "beat": "Sending due task tick"}


def the_check_says(value: object) -> checks.CheckMessage:
    """The E001 ``manage.py check`` reports for ``CELERY_DEADLINES_LEASE_TTL = value``."""
    with override_settings(CELERY_DEADLINES_LEASE_TTL=value):
        [message] = [m for m in check_settings(None) if m.id == "celery_deadlines.E001"]
    return message


@pytest.mark.parametrize("program", ["worker", "beat"])
@pytest.mark.parametrize("kind", ["django", "plain"])
def test_a_worker_or_beat_refuses_to_start_with_the_checks_message_until_the_setting_is_fixed(
    redis: Transport, queue: str, tmp_path: Path, kind: str, program: str
) -> None:
    write_project(tmp_path, kind, redis.broker_url, queue, "30s")
    log = tmp_path / f"{program}.log"
    process = start(tmp_path, kind, program, log)
    try:
        wait_for(
            lambda: process.poll() is not None or STARTED[program] in read_log(log), START_TIMEOUT
        )
    finally:
        kill_group(process)
    output = read_log(log)
    assert STARTED[program] not in output, f"{program} started on a bad setting:\n{output}"
    assert process.returncode == 1, output
    said = the_check_says("30s")
    assert "deadlines_lease_ttl (Django: CELERY_DEADLINES_LEASE_TTL)" in said.msg
    assert f"(celery_deadlines.E001) {said.msg}\n\tHINT: {said.hint}" in output, output
    assert "Traceback" not in output, output

    # the same project with the setting fixed starts
    write_project(tmp_path, kind, redis.broker_url, queue, 30)
    if kind == "django":  # the ledger's tables, which a started worker reconciles
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "-v", "0"],
            cwd=tmp_path, env=project_env(tmp_path, kind),
            check=True, capture_output=True, timeout=START_TIMEOUT,
        )  # fmt: skip
    fixed = tmp_path / f"{program}-fixed.log"
    process = start(tmp_path, kind, program, fixed)
    try:
        wait_for(
            lambda: process.poll() is not None or STARTED[program] in read_log(fixed), START_TIMEOUT
        )
        assert process.poll() is None, read_log(fixed)
    finally:
        kill_group(process)
    assert "celery-deadlines" not in read_log(fixed)


@pytest.fixture(autouse=True)
def _no_messages_left(redis: Transport, queue: str) -> Iterator[None]:
    """What a started beat sent is dropped with the test's queue."""
    yield
    import redis as redis_client

    with redis_client.Redis.from_url(redis.broker_url) as connection:
        connection.delete(queue)
