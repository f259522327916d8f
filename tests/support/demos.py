"""The demo runs that tests/repository/test_demo.py reads (``python -m demo_project.run_demo``).

Each run is a subprocess of its own, on its own broker, database and folder, and spends
its time waiting on its own workers, deadlines and retries: the selected runs are
started together, once per session, as soon as the session has collected its tests
(tests/conftest.py), so they run beside everything else; each test reads the output of
its own. Under pytest-xdist one process starts them (the first xdist worker, whether or
not it runs a demo test) into the folder every xdist worker of the session shares: a
run writes its output and then its exit status there, and a test on any xdist worker
reads them. The starting process stops them (and drops the demo's database) at the end
of its session, after waiting for them to finish: a demo test on another xdist worker
may still be reading.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import isolation
from tests.support.processes import REPO, reachable

#: How long one demo run may take.
TIMEOUT = 180.0

#: The demo each test of tests/repository/test_demo.py reads.
DEMO_OF = {
    "test_the_demo_explains_the_story_on_the_embedded_default": "embedded",
    "test_the_demo_runs_on_redis_and_postgresql": "redis-postgresql",
    "test_the_demo_runs_on_rabbitmq": "rabbitmq",
}

#: What the starting process writes once every demo it starts has started: their names
#: and when they started (epoch seconds), for the tests of every xdist worker.
STARTED = "started.json"

#: Runs ``python -m demo_project.run_demo`` and then writes its exit status to ``status``
#: (atomically), so that a process other than this one's parent can tell it ended.
RUNNER = (
    '"$0" -m demo_project.run_demo > "$1/stdout" 2> "$1/stderr"; '
    'echo $? > "$1/status.partial"; mv "$1/status.partial" "$1/status"'
)


@dataclass
class Demo:
    """One demo run, as any xdist worker sees it: its folder and the time it must end by."""

    folder: Path
    deadline: float

    def output(self) -> str:
        """Its whole output once it exited (it must exit 0 within the timeout)."""
        status = self.folder / "status"
        while not status.exists():
            if time.time() > self.deadline:
                pytest.fail(f"the demo did not finish within {TIMEOUT:.0f} s:\n{self.read()}")
            time.sleep(0.2)
        output = self.read()
        assert status.read_text().strip() == "0", output
        return output

    def read(self) -> str:
        return "".join(
            (self.folder / name).read_text(errors="replace")
            for name in ("stdout", "stderr")
            if (self.folder / name).exists()
        )


def start_demo(var: Path, **env: str) -> subprocess.Popen[bytes]:
    var.mkdir()
    return subprocess.Popen(
        ["/bin/sh", "-c", RUNNER, sys.executable, str(var)],
        cwd=REPO,
        env={
            **os.environ,
            "DEMO_VAR_DIR": str(var),
            "DEMO_QUEUE_PREFIX": isolation.queue_name(""),
            **env,
        },
        start_new_session=True,
    )


def selected_demos(session: pytest.Session) -> set[str]:
    """The demos the session's selected tests read."""
    return {DEMO_OF[item.name] for item in session.items if item.name in DEMO_OF}


def shared_folder(factory: pytest.TempPathFactory) -> Path:
    """The demos' folder, the same for every xdist worker of the session."""
    base = factory.getbasetemp()
    return (base.parent if isolation.XDIST_WORKER else base) / "demos"


def starts_the_demos() -> bool:
    """Whether this process starts the session's demos (the first xdist worker does)."""
    return isolation.XDIST_WORKER in ("", "gw0")


@dataclass
class Demos:
    """The demo runs this process started, stopped (and their database dropped) at the end
    of its session."""

    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    deadline: float = 0.0
    database: str | None = None

    def start(self, wanted: set[str], folder: Path) -> None:
        """Start the ``wanted`` demos whose services are reachable, then say which."""
        folder.mkdir()
        started_at = time.time()
        self.deadline = started_at + TIMEOUT
        started = []
        if "embedded" in wanted:
            self.processes.append(start_demo(folder / "embedded"))
            started.append("embedded")
        if (
            "redis-postgresql" in wanted
            and reachable(isolation.REDIS_HOST, isolation.REDIS_PORT)
            and reachable("127.0.0.1", 5432)
        ):
            self.database = create_database()
            self.processes.append(
                start_demo(
                    folder / "redis-postgresql",
                    CELERY_BROKER_URL=isolation.REDIS_DEMO,
                    DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{self.database}",
                )
            )
            started.append("redis-postgresql")
        if "rabbitmq" in wanted and reachable("127.0.0.1", 5672):
            self.processes.append(
                start_demo(
                    folder / "rabbitmq", CELERY_BROKER_URL="amqp://guest:guest@127.0.0.1:5672//"
                )
            )
            started.append("rabbitmq")
        partial = folder / (STARTED + ".partial")
        partial.write_text(json.dumps({"demos": started, "started_at": started_at}))
        partial.replace(folder / STARTED)

    def stop(self, wait: bool = True) -> None:
        """Wait for the demos to finish (within their timeout; not if ``wait`` is false:
        the session was interrupted), kill any left, drop the demo's database."""
        for process in self.processes:
            try:
                process.wait(max(0.0, self.deadline - time.time()) if wait else 0)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        self.processes.clear()
        if self.database is not None:
            drop_database(self.database)
            self.database = None


#: The demo runs this process started.
DEMOS = Demos()


def running_demos(folder: Path, timeout: float = 60.0) -> dict[str, Demo]:
    """The session's demos that were started (by whichever process starts them)."""
    started = folder / STARTED
    deadline = time.monotonic() + timeout
    while not started.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"no demo was started within {timeout:.0f} s ({started} is missing)")
        time.sleep(0.1)
    facts = json.loads(started.read_text())
    return {name: Demo(folder / name, facts["started_at"] + TIMEOUT) for name in facts["demos"]}


def create_database() -> str:
    import psycopg

    name = f"cd_demo_{uuid.uuid4().hex[:8]}"
    with psycopg.connect("postgresql://postgres@127.0.0.1/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


def drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
