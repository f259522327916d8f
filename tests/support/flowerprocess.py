"""A real Flower process for the integration tests, and what its HTTP API says.

:class:`FlowerProcess` runs ``celery -A tests.support.flowerapp flower`` on a free port
of 127.0.0.1 with its API open without authentication (``FLOWER_UNAUTHENTICATED_API``:
Flower answers 401 otherwise), and reads ``/api/task/info/<id>``: the task's state as
Flower built it from the workers' task events (``celery.events.state``), nothing else.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen
from typing import Any

from tests.support.processes import Transport, kill_group, read_log, spawn


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class FlowerProcess:
    """One Flower process, watching the events of ``transport``'s broker."""

    transport: Transport
    log_path: Path
    app_module: str = "tests.support.flowerapp"
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    process: Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> FlowerProcess:
        """Spawn Flower and wait until its HTTP server answers (its event stream is
        live only once it has seen a task: :meth:`wait_for_task`)."""
        self.process = spawn(
            [
                "-A", self.app_module, "flower",
                f"--port={self.port}", "--address=127.0.0.1", "--logging=info",
            ],
            self.transport, "flower", {"FLOWER_UNAUTHENTICATED_API": "true", **self.extra_env},
            self.log_path, "wb",
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"flower exited early:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url("/healthcheck"), timeout=2) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        self.kill()
        raise TimeoutError(f"flower not answering after {timeout} s:\n{self.log()}")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def task_info(self, task_id: str) -> dict[str, Any] | None:
        """Flower's ``/api/task/info/<id>``, or ``None`` while Flower knows no such task
        (404: no event of it arrived yet)."""
        try:
            with urllib.request.urlopen(self.url(f"/api/task/info/{task_id}"), timeout=5) as r:
                info: dict[str, Any] = json.loads(r.read())
                return info
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise

    def state_of(self, task_id: str) -> str | None:
        """The state Flower shows for ``task_id`` (``None``: it knows no such task)."""
        info = self.task_info(task_id)
        return None if info is None else str(info["state"])

    def kill(self) -> None:
        kill_group(self.process)

    def log(self) -> str:
        return read_log(self.log_path)
