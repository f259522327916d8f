"""Real ``celery worker`` subprocesses for integration tests.

A :class:`WorkerProcess` runs ``celery -A tests.support.workerapp worker`` with its own
queue, broker URL and (optionally) a shifted wall clock, waits until it logs that it is
ready, and is stopped with SIGTERM (SIGKILL only if it will not stop). Its log is kept
and printed when a test fails, so a failure explains itself.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def reachable(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class Transport:
    """Where the integration tests send messages and read results."""

    name: str
    broker_url: str
    result_backend: str
    host: str | None = None
    port: int | None = None
    fs_folder: str | None = None

    def env(self) -> dict[str, str]:
        env = {"TEST_BROKER_URL": self.broker_url, "TEST_RESULT_BACKEND": self.result_backend}
        if self.fs_folder:
            env["TEST_FS_FOLDER"] = self.fs_folder
            env["TEST_FS_CONTROL"] = self.fs_folder + "-control"
        return env


@dataclass
class WorkerProcess:
    """One ``celery worker`` subprocess."""

    transport: Transport
    queue: str
    log_path: Path
    pool: str = "prefork"
    concurrency: int = 1
    clock_shift_file: Path | None = None
    app_module: str = "tests.support.workerapp"
    node: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> WorkerProcess:
        env = {**os.environ, **self.transport.env(), "TEST_QUEUE": self.queue, **self.extra_env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        if self.clock_shift_file is not None:
            env["CELERY_DEADLINES_TESTING_WALL_CLOCK_SHIFT_FILE"] = str(self.clock_shift_file)
        command = [
            sys.executable, "-m", "celery", "-A", self.app_module, "worker",
            "-P", self.pool, "-c", str(self.concurrency), "-Q", self.queue,
            "-n", f"{self.node or self.queue}@%h", "-l", "INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " ready." in self.log():
                return self  # even if a crash test killed it since: it did start
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited early:\n{self.log()}")
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"worker not ready after {timeout} s:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL the whole worker (main and pool processes): no shutdown, no acks."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 20.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@dataclass
class BeatProcess:
    """One ``celery beat`` subprocess with the library's scheduler."""

    transport: Transport
    queue: str
    log_path: Path
    state_path: Path
    app_module: str = "tests.support.ledgerapp"
    extra_env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> BeatProcess:
        env = {**os.environ, **self.transport.env(), "TEST_QUEUE": self.queue, **self.extra_env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        command = [
            sys.executable, "-m", "celery", "-A", self.app_module, "beat",
            "-S", "celery_deadlines.beat:DeadlineScheduler", "-s", str(self.state_path),
            "--max-interval", "1", "-l", "INFO",
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        wait_for(lambda: "beat: Starting..." in self.log(), timeout)
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown, no sync of its state file."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def wait_for(predicate: Any, timeout: float, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; never a bare sleep."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(interval)
