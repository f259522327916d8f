"""A user's test suite, run as its developers run it: a pytest of its own, in a copy of
the project (tests/support/user_suite/project), with the project's ``pytest.ini``,
``conftest.py``, pytest-django's marks and celery.contrib.pytest's worker.

With ``pytest_plugins = ["celery_deadlines.pytest_plugin"]`` a DeadlineTask behaves
there as a plain task does: eagerly (``task_always_eager``, ``apply()``) its effect
runs, once per key, retries included, against the in-memory ledger; under
``celery_worker`` its ``delay()`` works with pytest-django's default ``django_db`` and
without a mark; a test marked ``deadlines_database_ledger`` with
``django_db(transaction=True)`` runs on the database's ledger, eager runs included.
Without the plugin an eager run is a run in the database's ledger.
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


def test_without_the_plugin_an_eager_charge_is_a_run_in_the_database_ledger(
    project: Path,
) -> None:
    # Given the suite without celery-deadlines' plugin, and tests that charge eagerly
    # (the settings' CELERY_TASK_ALWAYS_EAGER) on the test database, in a transaction
    # or not, and without it
    (project / "conftest.py").write_text('pytest_plugins = ["celery.contrib.pytest"]\n')
    (project / "test_orders.py").write_text(
        "import pytest\n"
        "from bakery.tasks import charge\n"
        "from celery_deadlines.models import Run\n\n\n"
        "@pytest.mark.django_db(transaction=True)\n"
        "def test_an_eager_charge() -> None:\n"
        '    result = charge.delay("plain-1", 1)\n'
        '    assert result.get() == "receipt-plain-1"\n'
        '    assert Run.objects.get(task_id=result.id).status == "SUCCEEDED"\n\n\n'
        "@pytest.mark.django_db\n"
        "def test_an_eager_charge_in_the_tests_transaction() -> None:\n"
        '    assert charge.delay("plain-2", 1).get() == "receipt-plain-2"\n\n\n'
        "def test_an_eager_charge_without_the_database() -> None:\n"
        '    charge.delay("plain-3", 1).get()\n'
    )
    # When it runs, the charges are runs in the database's ledger, and the test database
    # is dropped at the end (no connection of the library's is left open: warnings are
    # errors in this suite); a test without database access is told to ask for it
    status, output = run_the_users_pytest(project)
    assert status == 1, output
    passed = sorted(re.findall(r"^PASSED \S+::(test_\w+)", output, re.M))
    failed = re.findall(r"^FAILED \S+::(test_\w+)", output, re.M)
    assert passed == ["test_an_eager_charge", "test_an_eager_charge_in_the_tests_transaction"]
    assert failed == ["test_an_eager_charge_without_the_database"], output
    assert 'Database access not allowed, use the "django_db" mark' in output
    assert "1 failed, 2 passed in" in output  # and no error dropping the database
