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
    #: more arguments of ``celery worker`` (``--time-limit=2``...)
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> WorkerProcess:
        """Spawn the worker and wait until it is ready."""
        return self.spawn().wait_ready(timeout)

    def spawn(self) -> WorkerProcess:
        """Spawn the worker without waiting for it (then ``wait_ready``): the workers of
        one test can start side by side."""
        extra = dict(self.extra_env)
        if self.clock_shift_file is not None:
            extra["CELERY_DEADLINES_TESTING_WALL_CLOCK_SHIFT_FILE"] = str(self.clock_shift_file)
        self.process = spawn(
            [
                "-A", self.app_module, "worker",
                "-P", self.pool, "-c", str(self.concurrency), "-Q", self.queue,
                "-n", f"{self.node or self.queue}@%h", "-l", "INFO",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
                *self.extra_args,
            ],
            self.transport, self.queue, extra, self.log_path, "wb",
        )  # fmt: skip
        return self

    def wait_ready(self, timeout: float = 30.0) -> WorkerProcess:
        """Wait until the spawned worker logs that it is ready."""
        if self.process is None:
            raise RuntimeError("the worker was not spawned")
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
        kill_group(self.process)

    def log(self) -> str:
        return read_log(self.log_path)

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
        self.process = spawn(
            [
                "-A", self.app_module, "beat",
                "-S", "celery_deadlines.beat:DeadlineScheduler", "-s", str(self.state_path),
                "--max-interval", "1", "-l", "INFO",
            ],
            self.transport, self.queue, self.extra_env, self.log_path, "ab",
        )  # fmt: skip
        wait_for(lambda: "beat: Starting..." in self.log(), timeout)
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown, no sync of its state file."""
        kill_group(self.process)

    def log(self) -> str:
        return read_log(self.log_path)


def spawn(
    arguments: list[str], transport: Transport, queue: str, extra_env: dict[str, str],
    log_path: Path, mode: str,
) -> subprocess.Popen[bytes]:  # fmt: skip
    """``python -m celery <arguments>`` in a session of its own, logging to ``log_path``
    (opened with ``mode``), with the transport's and the test's environment."""
    env = {**os.environ, **transport.env(), "TEST_QUEUE": queue, **extra_env}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    with log_path.open(mode) as log:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", *arguments], cwd=REPO, env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def kill_group(process: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL a spawned process and its children, and reap it."""
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def read_log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


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


def shift_wall_clock(path: Path, seconds: float) -> None:
    """Set the wall-clock shift a worker reads from ``path`` (``WorkerProcess``'s
    ``clock_shift_file``), atomically: a worker reading it mid-write sees the old shift or
    the new one, never an empty file (which it would read as no shift)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(str(seconds))
    os.replace(partial, path)
