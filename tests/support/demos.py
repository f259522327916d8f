"""The demo runs that tests/integration/test_demo.py reads (``python -m demo_project.run_demo``).

Each run is a subprocess of its own, on its own broker, database and folder, and spends
its time waiting on its own workers, deadlines and retries: the selected runs are
started together, once, and each test reads the output of its own. They are started
as soon as a session's first Django test begins (tests/django/conftest.py) when the
session runs the Django tier, which uses no broker, no real worker and no wall-clock
margin, so the demos run beside it; otherwise when the demo module begins.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.processes import REPO, reachable

#: How long one demo run may take.
TIMEOUT = 180.0

#: The demo each test of tests/integration/test_demo.py reads.
DEMO_OF = {
    "test_the_demo_explains_the_story_on_the_embedded_default": "embedded",
    "test_the_demo_runs_on_redis_and_postgresql": "redis-postgresql",
    "test_the_demo_runs_on_rabbitmq": "rabbitmq",
}


@dataclass
class Demo:
    """One demo subprocess, its output kept in files."""

    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    def output(self) -> str:
        """Its whole output once it exited (it must exit 0 within the timeout)."""
        try:
            self.process.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            pytest.fail(f"the demo did not finish within {TIMEOUT:.0f} s:\n{self.read()}")
        output = self.read()
        assert self.process.returncode == 0, output
        return output

    def read(self) -> str:
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")


def start_demo(var: Path, **env: str) -> Demo:
    var.mkdir()
    with (var / "stdout").open("wb") as out, (var / "stderr").open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "demo_project.run_demo"],
            cwd=REPO,
            env={**os.environ, "DEMO_VAR_DIR": str(var), **env},
            stdout=out,
            stderr=err,
        )
    return Demo(process, var / "stdout", var / "stderr")


def selected_demos(session: pytest.Session) -> set[str]:
    """The demos the session's selected tests read."""
    return {DEMO_OF[item.name] for item in session.items if item.name in DEMO_OF}


@dataclass
class Demos:
    """The demo runs of one session: started once, stopped (and their database dropped)
    when the demo module ends, or at the end of the session at the latest."""

    started: dict[str, Demo] = field(default_factory=dict)
    database: str | None = None

    def start(self, wanted: set[str], folder: Path) -> dict[str, Demo]:
        """Start the ``wanted`` demos not started yet whose services are reachable."""
        if "embedded" in wanted and "embedded" not in self.started:
            self.started["embedded"] = start_demo(folder / "embedded")
        if (
            "redis-postgresql" in wanted
            and "redis-postgresql" not in self.started
            and reachable("127.0.0.1", 6379)
            and reachable("127.0.0.1", 5432)
        ):
            self.database = create_database()
            self.started["redis-postgresql"] = start_demo(
                folder / "redis-postgresql",
                CELERY_BROKER_URL="redis://127.0.0.1:6379/9",
                DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{self.database}",
            )
        if "rabbitmq" in wanted and "rabbitmq" not in self.started and reachable("127.0.0.1", 5672):
            self.started["rabbitmq"] = start_demo(
                folder / "rabbitmq", CELERY_BROKER_URL="amqp://guest:guest@127.0.0.1:5672//"
            )
        return self.started

    def stop(self) -> None:
        for demo in self.started.values():
            if demo.process.poll() is None:
                demo.process.kill()
                demo.process.wait(10)
        if self.database is not None:
            drop_database(self.database)
            self.database = None


#: This session's demo runs.
DEMOS = Demos()


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
