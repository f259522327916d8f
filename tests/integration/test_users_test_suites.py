"""A user's test suite, run as its developers run it: a pytest of its own, in a copy of
the project (tests/support/user_suite/project), with the project's ``pytest.ini``,
``conftest.py``, pytest-django's marks and celery.contrib.pytest's worker.

With ``pytest_plugins = ["celery_deadlines.pytest_plugin"]`` a DeadlineTask behaves
there as a plain task does: eagerly (``task_always_eager``, ``apply()``) its effect
runs, once per key, retries included, against the in-memory ledger; under
``celery_worker`` its ``delay()`` works with pytest-django's default ``django_db`` and
without a mark; a test marked ``deadlines_database_ledger`` with
``django_db(transaction=True)`` runs on the database's ledger, and an eager effect there
says it needs a worker. Without the plugin an eager effect says what to do.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import service_unavailable
from tests.support import isolation
from tests.support.processes import reachable

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parents[1] / "support" / "user_suite" / "project"
#: The user's tests, each of which must pass.
SUITE = PROJECT / "test_orders.py"
#: How long the user's pytest may take on a busy machine (three in-process workers).
TIMEOUT = 300


def the_users_environment() -> dict[str, str]:
    """This session's environment without what pytest, pytest-django and this suite set
    for themselves: the user's pytest reads its own ``pytest.ini``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYTEST_", "CELERY_DEADLINES_"))
        and name != "DJANGO_SETTINGS_MODULE"
    }
    env["DATABASE_URL"] = os.environ.get(
        "TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres"
    )
    # beside this session's own test database (and the other xdist worker's)
    own = os.environ.get("TEST_POSTGRES_DB", "test_celery_deadlines")
    suffix = f"_{isolation.XDIST_WORKER}" if isolation.XDIST_WORKER else ""
    env["BAKERY_TEST_DATABASE"] = f"{own}_bakery{suffix}"
    return env


def run_the_users_pytest(folder: Path, *arguments: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *arguments],
        cwd=folder,
        env=the_users_environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the user's project, away from this repository's pytest configuration."""
    if not reachable("127.0.0.1", 5432):
        service_unavailable("PostgreSQL 127.0.0.1:5432")
    copy = tmp_path / "bakery_project"
    shutil.copytree(PROJECT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_with_the_plugin_a_users_suite_runs_deadline_tasks_as_plain_tasks(
    project: Path,
) -> None:
    written = sorted(re.findall(r"^def (test_\w+)", SUITE.read_text(), re.M))
    status, output = run_the_users_pytest(project)
    passed = sorted(re.findall(r"^PASSED \S+::(test_\w+)", output, re.M))
    assert (status, passed) == (0, written), output
    assert "test_a_worker_charges_in_a_database_test" in passed


def test_without_the_plugin_an_eager_effect_says_it_needs_a_worker(project: Path) -> None:
    # Given the suite without celery-deadlines' plugin, and a test that runs a charge
    # eagerly (the settings' CELERY_TASK_ALWAYS_EAGER)
    (project / "conftest.py").write_text('pytest_plugins = ["celery.contrib.pytest"]\n')
    (project / "test_orders.py").write_text(
        "from bakery.tasks import charge\n\n\n"
        "def test_an_eager_charge() -> None:\n"
        '    charge.delay("plain-1", 1).get()\n'
    )
    # When it runs, the charge fails before anything is charged, and says why and
    # what to do: not "add 'celery_deadlines' to INSTALLED_APPS" (it is installed)
    status, output = run_the_users_pytest(project)
    assert status == 1, output
    assert "ConfigurationError: side effects need a worker: an eager run" in output
    assert "pytest_plugins = ['celery_deadlines.pytest_plugin']" in output
    assert "to INSTALLED_APPS" not in output
