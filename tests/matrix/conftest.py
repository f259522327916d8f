"""The matrix tier's session: the project's settings (pytest runs with
``--ds=tests.matrix.config.settings.production``: ``make matrix-configs``), the provider
process, and each row's scenario run once for all its tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.processes import REPO

from . import scenario
from .rows import ROWS, Row


@pytest.fixture(scope="session")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The provider process (tests/support/sink.py): its URL; its log is
    ``MATRIX_PROVIDER_LOG``."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path_factory.mktemp("provider") / "provider.jsonl"
    os.environ["MATRIX_PROVIDER_LOG"] = str(log)
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.sink", str(log), str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert "ready" in process.stdout.readline()
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(10)
    process.stdout.close()


_observed: dict[tuple[str, str], scenario.Observed] = {}


@pytest.fixture
def observe(
    provider: str, tmp_path_factory: pytest.TempPathFactory, django_db_blocker: object
) -> object:
    def observed(row: Row, serializer: str) -> scenario.Observed:
        key = (row.name, serializer)
        if key not in _observed:
            folder = tmp_path_factory.mktemp(f"{row.name}-{serializer}")
            with django_db_blocker.unblock():  # type: ignore[attr-defined]
                _observed[key] = scenario.run(row, serializer, folder, provider)
        return _observed[key]

    return observed


def rows_here() -> list[Row]:
    import celery

    release = ".".join(celery.__version__.split(".")[:2])
    return [row for row in ROWS if row.celery == release]


_left_out: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the checks awaiting a fix (``rows.AWAITING_FIXES``), unless
    ``MATRIX_AWAITING=run``; each is named in the summary."""
    from .rows import AWAITING_FIXES

    if os.environ.get("MATRIX_AWAITING") == "run":
        return
    kept, dropped = [], []
    for item in items:
        row = getattr(getattr(item, "callspec", None), "params", {}).get("row")
        name = getattr(item, "originalname", item.name)
        reason = None
        if isinstance(row, Row):
            reason = AWAITING_FIXES.get((row.name, name)) or AWAITING_FIXES.get(("*", name))
        if reason is None:
            kept.append(item)
        else:
            dropped.append(item)
            _left_out.append(f"{item.nodeid}: {reason}")
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_terminal_summary(terminalreporter: object) -> None:
    if _left_out:
        write = terminalreporter.write_line  # type: ignore[attr-defined]
        write(f"awaiting a fix, not run ({len(_left_out)}; MATRIX_AWAITING=run runs them):")
        for line in _left_out:
            write(f"  {line}")
