"""Shared fixtures: a fake clock, a clean environment, "skip locally, fail in CI", and
the headers of every message a test published."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery.signals import after_task_publish
from hypothesis import settings

from celery_deadlines.testing import FakeClock, use_clock
from tests.support import demos, summaries

for _name in list(os.environ):
    if _name.startswith("CELERY_DEADLINES_") and _name != "CELERY_DEADLINES_SOAK":
        del os.environ[_name]


# On failure, hypothesis prints the example and a blob that replays it exactly; pin a
# failing one with @example(...) so it stays a regression case. No per-example deadline:
# it is an assertion on wall time (200 ms by default), which a stalled 2-core machine
# fails for a pure function (test_incoming's property test failed once in a full run,
# and not in 340 runs after it, seeds drawn at random).
settings.register_profile("default", print_blob=True, deadline=None)
settings.load_profile("default")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Every run of the randomized tests has a seed, printed in the header to replay it."""
    if config.getoption("hypothesis_seed", None) is None:
        config.option.hypothesis_seed = random.randrange(2**32)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    for line in config.stash.get(summaries.LINES, []):
        terminalreporter.write_line(line)


def pytest_report_header(config: pytest.Config) -> str:
    seed = config.getoption("hypothesis_seed")
    return f"hypothesis seed: {seed} (replay with --hypothesis-seed={seed})"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the demo runs the selected tests read, at once, to run beside every other
    test (tests/support/demos.py; under xdist, the first xdist worker starts them)."""
    wanted = demos.selected_demos(session)
    if wanted and demos.starts_the_demos() and not session.config.option.collectonly:
        factory: pytest.TempPathFactory = getattr(session.config, "_tmp_path_factory")  # noqa: B009
        demos.DEMOS.start(wanted, demos.shared_folder(factory))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED or bool(session.shouldstop)
    demos.DEMOS.stop(wait=not interrupted)


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    """A fake clock installed for the whole process (unit tests never sleep)."""
    with use_clock(FakeClock()) as fake:
        yield fake


def service_unavailable(what: str) -> None:
    """Skip when a service is missing on a laptop; fail when ``CI=true``."""
    message = f"{what} is not reachable"
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"{message} (CI=true: services are required)", pytrace=False)
    pytest.skip(message)


@pytest.fixture
def published() -> Iterator[list[dict[str, Any]]]:
    """Headers of every message published during the test."""
    seen: list[dict[str, Any]] = []

    def record(headers: dict[str, Any] | None = None, **_: Any) -> None:
        seen.append(dict(headers or {}))

    after_task_publish.connect(record, weak=False)
    yield seen
    after_task_publish.disconnect(record)


@pytest.fixture
def listener() -> Iterator[tuple[str, Callable[[], bool]]]:
    """A listening socket nobody accepts on: its address, and whether anything connected
    (the kernel completes a connection into the backlog without ``accept``)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)

        def reached() -> bool:
            try:
                connection, _ = server.accept()
            except BlockingIOError:
                return False
            connection.close()
            return True

        yield f"127.0.0.1:{server.getsockname()[1]}", reached
