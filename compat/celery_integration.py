"""Celery's own integration tests (canvas and tasks), with DeadlineTask as the default
task class under a default budget, against ``celery.Task``.

``make celery-integration`` (opt-in, about 20 minutes; or ``.venv/bin/python -m
compat.celery_integration [--budget SECONDS|none] [TEST PATH...]``):

1. Celery's tests from the sdist of the release installed here, as ``make
   celery-compat`` has them (``.celery-compat/``);
2. a virtualenv there: that release with the versions of its dependencies (and of the
   Redis client) installed here, and the test requirements Celery pins for them (pytest,
   pytest-timeout, pytest-rerunfailures, pydantic); celery_deadlines itself is imported
   from this work tree;
3. two ``redis-server`` processes of its own (free ports, no data kept), one per run:
   each run's broker and result backend (``TEST_BROKER``, ``TEST_BACKEND``, as Celery's
   integration conftest reads them) and the server its tasks keep their own keys on
   (``REDIS_HOST``, ``REDIS_PORT``: ``redis-echo``, ``Done``, ... in database 0, which
   Celery's tests write and delete by name). The runs must not share one: those keys
   have fixed names, and Celery's canvas tests count the server's pub/sub channels,
   which no database number separates;
4. runs ``t/integration/test_canvas.py`` and ``t/integration/test_tasks.py`` twice,
   side by side, each with the worker their conftest starts (in the pytest process, a
   prefork pool): with ``celery.Task`` as the default task class (the baseline), and
   with ``celery_deadlines.task:DeadlineTask`` and ``deadlines_default_budget`` set to
   ``--budget`` (300 s unless said; ``none``: no budget);
5. fails when a test fails (or errors) under DeadlineTask but not under ``celery.Task``.
   The tests that pass under DeadlineTask only are listed too (a timing test the
   machine made flaky shows up on either side).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from compat.celery_compat import (
    CACHE,
    DEADLINE_TASK_CLS,
    HERE,
    REPO,
    _load,
    built,
    dependencies,
    extract,
    regressions,
    requirements_of,
    sdist,
    summary,
)

TESTS = ("t/integration/test_canvas.py", "t/integration/test_tasks.py")
#: Celery's test requirements of its integration tests, pinned as Celery pins them
NEEDED = ("pytest", "pytest-timeout", "pytest-rerunfailures", "pydantic")
REQUIREMENT_FILES = (
    "requirements/test.txt",
    "requirements/test-integration.txt",
    "requirements/extras/pydantic.txt",
)
DEFAULT_BUDGET = 300.0
#: How long a run may take in all (Celery's own per-test timeout is 300 s)
RUN_TIMEOUT = 3 * 3600
DESCRIPTION = "Celery's integration tests (canvas, tasks), with DeadlineTask under a budget."


class Run(NamedTuple):
    name: str
    task_cls: str | None
    #: the app's default settings (``deadlines_default_budget``)
    defaults: dict[str, object]
    outcomes: Path
    log: Path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("tests", nargs="*", help=f"test paths (default: {' '.join(TESTS)})")
    parser.add_argument(
        "--budget",
        default=str(DEFAULT_BUDGET),
        help="deadlines_default_budget of the DeadlineTask run, in seconds, or 'none' "
        f"(default: {DEFAULT_BUDGET:g})",
    )
    options = parser.parse_args(argv)
    budget = None if options.budget.lower() == "none" else float(options.budget)
    if shutil.which("redis-server") is None:
        print("celery-integration: needs redis-server (apt-get install -y redis-server)")
        return 2
    started = time.monotonic()
    CACHE.mkdir(parents=True, exist_ok=True)
    version = importlib.metadata.version("celery")
    source = extract(sdist(version), CACHE / f"celery-{version}")
    wanted = [
        f"celery=={version}",
        *dependencies(),
        f"redis=={importlib.metadata.version('redis')}",
        *requirements_of(source, NEEDED, REQUIREMENT_FILES),
    ]
    python = built(CACHE / f"venv-{version}-integration", wanted)
    prepared = time.monotonic()
    print(f"celery-integration: Celery {version}, prepared in {prepared - started:.0f} s")
    named = "no budget" if budget is None else f"budget {budget:g} s"
    defaults: dict[str, object] = {} if budget is None else {"deadlines_default_budget": budget}
    runs = [
        Run(
            "celery.Task",
            None,
            {},
            CACHE / "integration-baseline.json",
            CACHE / "integration-baseline.log",
        ),
        Run(
            f"DeadlineTask, {named}",
            DEADLINE_TASK_CLS,
            defaults,
            CACHE / "integration-deadline.json",
            CACHE / "integration-deadline.log",
        ),
    ]
    print(f"celery-integration: running {' and '.join(TESTS)} twice, side by side", flush=True)
    codes = run_side_by_side(python, source, runs, options.tests or list(TESTS))
    results = {run.name: _load(run.outcomes) for run in runs}
    baseline, deadline = (results[run.name] for run in runs)
    for run in runs:
        print(f"  {run.name:<24} {summary(results[run.name]['outcomes'])}  (log: {run.log})")
    if deadline["apps_with_task_cls"] == 0:
        print("celery-integration: no app was created with DeadlineTask: the hook did not take")
        return 2
    found = regressions(baseline["outcomes"], deadline["outcomes"])
    for nodeid, outcome in found.items():
        print(f"\n--- {outcome} under DeadlineTask only: {nodeid}")
        print(deadline["details"].get(nodeid, "(no details)"))
    better = regressions(deadline["outcomes"], baseline["outcomes"])
    for nodeid, outcome in better.items():
        print(f"--- {outcome} under celery.Task only: {nodeid}")
    elapsed = time.monotonic() - started
    print(
        f"celery-integration: {len(found)} test(s) fail with DeadlineTask ({named}) and not "
        f"with celery.Task, {len(better)} the other way; {elapsed:.0f} s in all"
    )
    if any(code not in (0, 1) for code in codes):  # 1: some tests failed (compared above)
        print(f"celery-integration: pytest exited with {codes}: see the logs")
        return 2
    return 1 if found else 0


def run_side_by_side(
    python: Path, source: Path, runs: Sequence[Run], tests: Sequence[str]
) -> list[int]:
    """Run pytest once per ``runs`` item, at the same time, each on a Redis server of its
    own; their exit codes."""
    with redis_servers(len(runs)) as ports:
        processes = []
        for run, port in zip(runs, ports, strict=True):
            run.outcomes.unlink(missing_ok=True)
            command = [str(python), "-m", "pytest", *tests, "-q", "--timeout", "300"]
            command += ["-p", "no:cacheprovider", "-p", "celery_compat_plugin"]
            # Celery's fixtures (pytest-celery registers them; it is not installed here)
            command += ["-p", "celery.contrib.pytest"]
            command += ["--rootdir", str(source), "-c", str(source / "pyproject.toml")]
            with run.log.open("w") as log:
                processes.append(
                    subprocess.Popen(
                        command,
                        cwd=source,
                        env=environment(run, port),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        codes = []
        for process in processes:
            try:
                codes.append(process.wait(RUN_TIMEOUT))
            except subprocess.TimeoutExpired:
                process.kill()
                codes.append(process.wait())
        return codes


def environment(run: Run, port: int) -> dict[str, str]:
    """This environment without Celery's or Django's settings; the run's Redis server,
    and the plugin's variables."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CELERY_", "DJANGO_")) and key != "PYTHONPATH"
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # two sessions share the test sources
    env["CELERY_COMPAT_OUTCOMES"] = str(run.outcomes)
    env["TEST_BROKER"] = f"redis://127.0.0.1:{port}/0"
    env["TEST_BACKEND"] = f"redis://127.0.0.1:{port}/1"
    # where Celery's tasks and tests keep their own keys (redis-echo, ...): never the
    # machine's Redis, and never the other run's
    env["REDIS_HOST"], env["REDIS_PORT"] = "127.0.0.1", str(port)
    if run.task_cls is None:
        env["PYTHONPATH"] = str(HERE)  # the plugin only: celery_deadlines is not imported
    else:
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO)])
        env["CELERY_COMPAT_TASK_CLS"] = run.task_cls
    if run.defaults:
        env["CELERY_COMPAT_DEFAULTS"] = json.dumps(run.defaults)
    return env


@contextmanager
def redis_servers(count: int) -> Iterator[list[int]]:
    """``count`` redis-servers on free local ports, nothing persisted; stopped after."""
    folder = Path(tempfile.mkdtemp(prefix="celery-integration-redis-"))
    servers: list[subprocess.Popen[bytes]] = []
    ports: list[int] = []
    try:
        for index in range(count):
            port = _free_port()
            command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1"]
            command += ["--save", "", "--appendonly", "no", "--dir", str(folder)]
            with (folder / f"redis-{index}.log").open("wb") as log:
                servers.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
            ports.append(port)
        for port in ports:
            _wait_for_port(port)
        yield ports
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(30)
        shutil.rmtree(folder, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_for_port(port: int, timeout: float = 30.0) -> None:
    give_up = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError as exc:
            if time.monotonic() > give_up:
                message = f"celery-integration: redis-server on {port} did not start"
                raise SystemExit(message) from exc
            time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
