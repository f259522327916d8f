"""The README's first command: the demo runs the shop story and explains every task.

Run as a user runs it (a subprocess of ``python -m demo_project.run_demo``), on the
embedded default (SQLite + filesystem transport), on Redis + PostgreSQL and on RabbitMQ;
the three runs are independent (brokers, databases, folders) and run side by side.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import service_unavailable
from tests.support.processes import REPO, reachable

pytestmark = pytest.mark.integration


#: Each demo waits mostly on its own workers, deadlines and retries: the three run side by
#: side (different brokers, databases and folders), so the module costs about the longest.
TIMEOUT = 180.0


@dataclass
class Demo:
    """One ``python -m demo_project.run_demo`` subprocess, its output kept in files."""

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


#: The demo each test reads.
DEMO_OF = {
    "test_the_demo_explains_the_story_on_the_embedded_default": "embedded",
    "test_the_demo_runs_on_redis_and_postgresql": "redis-postgresql",
    "test_the_demo_runs_on_rabbitmq": "rabbitmq",
}


@pytest.fixture(scope="module")
def demos(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Demo]]:
    """The demos of the selected tests whose services are reachable, started together."""
    selected = {DEMO_OF.get(item.name) for item in request.session.items}
    folder = tmp_path_factory.mktemp("demos")
    started: dict[str, Demo] = {}
    if "embedded" in selected:
        started["embedded"] = start_demo(folder / "embedded")
    database = None
    if (
        "redis-postgresql" in selected
        and reachable("127.0.0.1", 6379)
        and reachable("127.0.0.1", 5432)
    ):
        database = create_database()
        started["redis-postgresql"] = start_demo(
            folder / "redis-postgresql",
            CELERY_BROKER_URL="redis://127.0.0.1:6379/9",
            DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{database}",
        )
    if "rabbitmq" in selected and reachable("127.0.0.1", 5672):
        started["rabbitmq"] = start_demo(
            folder / "rabbitmq", CELERY_BROKER_URL="amqp://guest:guest@127.0.0.1:5672//"
        )
    yield started
    for demo in started.values():
        if demo.process.poll() is None:
            demo.process.kill()
            demo.process.wait(10)
    if database is not None:
        drop_database(database)


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


def assert_story_explained(output: str) -> None:
    lines = output.splitlines()

    def line_of(prefix: str) -> str:
        matches = [line for line in lines if line.startswith(prefix)]
        assert matches, f"no line starts with {prefix!r}:\n{output}"
        return matches[0]

    assert "SUCCEEDED, started with" in line_of("place_order ")
    assert "SUCCEEDED, started with" in line_of("reserve_stock ")
    assert "(from the parent)" in output
    assert line_of("charge_card ").endswith("REFUSED at the retry gate: retry_budget_exhausted")
    assert line_of("print_label ").endswith("REFUSED at the claim gate: expired_before_claim")
    assert "ledger: EXPIRED (expired_before_claim), 0 claim(s)" in output
    assert "ledger: EXPIRED (retry_budget_exhausted)" in output
    assert "ledger: EXPIRED (deadline_passed), 0 claim(s)" in output  # order 43
    assert "order 43 placed with a deadline 1 s ago -> refused at once" in output
    assert "a retry needs" in output
    # one charge per order, although the provider lost its first reply (seed 000 fixture 4)
    assert "provider charges for order-42:capture:v1: 1 (replayed after reconciling" in output
    assert "SUCCEEDED, started with" in line_of("capture_payment ")
    # the notice lives by the 60 s delivery deadline, not the 8 s execution deadline
    notice = line_of("send_confirmation ")
    assert "SUCCEEDED, started with" in notice
    assert float(notice.split("started with ")[1].split(" s left")[0]) > 8
    # seed 003: the order moved to the locked warehouse queue while the worker was down;
    # the resumed plan is refused with a reason the user can read, and nothing changed
    assert "change_address REFUSED on resume: assumption_changed" in output
    assert "order_state was 'open', is now 'locked_for_warehouse'" in output
    assert "plan address-42: INVALIDATED assumption_changed" in output
    assert "ledger: FAILED (assumption_changed), 2 claim(s)" in output
    assert "the order's address is still 'Alte Str. 1, Berlin'" in output


def test_the_demo_explains_the_story_on_the_embedded_default(demos: dict[str, Demo]) -> None:
    output = demos["embedded"].output()
    assert "broker filesystem://, database sqlite3" in output
    assert_story_explained(output)


def test_the_demo_runs_on_redis_and_postgresql(demos: dict[str, Demo]) -> None:
    if "redis-postgresql" not in demos:
        service_unavailable("Redis 127.0.0.1:6379 or PostgreSQL 127.0.0.1:5432")
    output = demos["redis-postgresql"].output()
    assert "broker redis://127.0.0.1:6379/9, database postgresql" in output
    assert_story_explained(output)


def test_the_demo_runs_on_rabbitmq(demos: dict[str, Demo]) -> None:
    if "rabbitmq" not in demos:
        service_unavailable("RabbitMQ 127.0.0.1:5672")
    output = demos["rabbitmq"].output()
    assert "broker amqp://guest:**@127.0.0.1:5672//, database sqlite3" in output  # no password
    assert_story_explained(output)
