"""The matrix tier's session: the project's settings (pytest runs with
``--ds=tests.matrix.config.settings.production``: ``make matrix-configs``), the provider
process, and every row's scenario, run side by side once for all the tests
(``observations``): each row runs the probes its selected tests check (``probe`` marks)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import REPO

from . import scenario
from .rows import AWAITING_FIXES, ROWS, Row

#: How many rows run at once. Each row's worker holds about seven connections to the
#: shared PostgreSQL (its main process, its reconciler, a pool process or thread each;
#: a greenlet pool one per task: Django's connections are per greenlet), which allows
#: 100 for every session on the machine: five rows take about 40.
SLOTS = int(os.environ.get("MATRIX_SLOTS", "5"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "probe(name): the scenario's probe a matrix test checks (tests/matrix/rows.py)"
    )


def rows_here() -> list[Row]:
    import celery

    release = ".".join(celery.__version__.split(".")[:2])
    return [row for row in ROWS if row.celery == release]


_left_out: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the checks awaiting a fix (``rows.AWAITING_FIXES``), unless
    ``MATRIX_AWAITING=run``, each named in the summary."""
    run_awaiting = os.environ.get("MATRIX_AWAITING") == "run"
    kept, dropped = [], []
    for item in items:
        row = getattr(getattr(item, "callspec", None), "params", {}).get("row")
        name = getattr(item, "originalname", item.name)
        reason = None
        if isinstance(row, Row) and not run_awaiting:
            reason = AWAITING_FIXES.get((row.name, name)) or AWAITING_FIXES.get(("*", name))
        if reason is None:
            kept.append(item)
        else:
            dropped.append(item)
            _left_out.append(f"{item.nodeid}: {reason}")
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


_timelines: list[str] = []


def pytest_terminal_summary(terminalreporter: object) -> None:
    write = terminalreporter.write_line  # type: ignore[attr-defined]
    if _timelines:
        write(f"the rows' timelines (s from the first row's start, then its own): {_timelines[0]}")
        for line in _timelines[1:]:
            write(f"  {line}")
    if _left_out:
        write(f"awaiting a fix, not run ({len(_left_out)}; MATRIX_AWAITING=run runs them):")
        for line in _left_out:
            write(f"  {line}")


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


@pytest.fixture(scope="session")
def django_db_setup(django_test_environment: None, django_db_blocker: object) -> Iterator[None]:
    """The session's test database, migrated: the template of each row's ledger. (The
    tests read what the rows observed and ask for no database: pytest-django would set
    none up.)"""
    from django.test.utils import setup_databases, teardown_databases

    with django_db_blocker.unblock():  # type: ignore[attr-defined]
        # a set of aliases, as pytest-django passes them (django-stubs say a mapping)
        aliases: Any = {"default"}
        config = setup_databases(verbosity=0, interactive=False, aliases=aliases)
    yield
    with django_db_blocker.unblock():  # type: ignore[attr-defined]
        teardown_databases(config, verbosity=0)


@pytest.fixture(scope="session")
def observations(
    request: pytest.FixtureRequest,
    provider: str,
    tmp_path_factory: pytest.TempPathFactory,
    django_db_setup: None,
    django_db_blocker: object,
) -> dict[tuple[str, str], scenario.Observed | str]:
    """Every planned row's scenario, side by side (``SLOTS`` rows at a time): by (row,
    serializer) what it observed, or why it failed."""
    planned: dict[str, set[str]] = {}  # the probes the selected tests check, by row
    for item in request.session.items:
        row = getattr(getattr(item, "callspec", None), "params", {}).get("row")
        probe = item.get_closest_marker("probe")
        if isinstance(row, Row) and probe is not None:
            planned.setdefault(row.name, set()).add(probe.args[0])
    plan = [
        (row, tuple(p for p in row.probes if p in planned[row.name]))
        for row in rows_here()
        if row.name in planned
    ]
    folder: Path = tmp_path_factory.mktemp("rows")
    with django_db_blocker.unblock():  # type: ignore[attr-defined]
        ran = scenario.run_rows(plan, folder, provider, SLOTS)
    _timelines.extend(
        [
            f"{len(plan)} rows in {ran.seconds:.1f} s ({ran.copying:.1f} s copying the "
            f"database), {SLOTS} at a time",
            *ran.timelines,
        ]
    )
    return ran.outcomes


_OBSERVED = pytest.StashKey[scenario.Observed]()
_failed_rows: dict[str, str] = {}

Observe = Callable[[Row, str], scenario.Observed]


@pytest.fixture
def observe(
    request: pytest.FixtureRequest,
    observations: dict[tuple[str, str], scenario.Observed | str],
) -> Observe:
    """What the row's scenario with a serializer observed; a row that failed fails each
    of its tests with why (the first with what its callers saw and its worker's log)."""

    def observed(row: Row, serializer: str) -> scenario.Observed:
        outcome = observations[(row.name, serializer)]
        if isinstance(outcome, str):
            first = _failed_rows.setdefault(row.name, request.node.nodeid)
            if first != request.node.nodeid:
                pytest.fail(f"row {row.name} failed: see {first}", pytrace=False)
            pytest.fail(outcome, pytrace=False)
        request.node.stash[_OBSERVED] = outcome
        return outcome

    return observed


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed check shows what every probe's caller and the ledger saw, and the row's
    worker's log."""
    report = yield
    observed = item.stash.get(_OBSERVED, None)
    if observed is not None and report.when == "call" and report.failed:
        report.sections.append(("what the callers and the ledger saw", observed.told()))
        report.sections.append(("the worker's log", scenario.cut(observed.log) or "(eager)"))
    return report
