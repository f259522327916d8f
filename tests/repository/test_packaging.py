"""The published metadata says what is true: the licence, the extras, the versions the CI
runs, what the sdist carries; and the test-only crash points cost nothing when off.

What `make dist` actually builds is checked by .ci/check_dist.py (after `twine check`).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import django
import pytest

from celery_deadlines.ledger import _crashpoints

REPO = Path(__file__).resolve().parents[2]
PYPROJECT: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT: dict[str, Any] = PYPROJECT["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]
BUILD: dict[str, Any] = PYPROJECT["tool"]["hatch"]["build"]["targets"]

#: Python versions the CI runs (`make test` on python3.11, `make matrix` on 3.13) and the
#: one between them that requires-python admits; Django: 5.2 (python3.11's newest) and
#: the newest release `make matrix` installs on 3.13.
PYTHONS = {"3.11", "3.12", "3.13"}
DJANGOS = {"5.2", "6.1"}


def claimed(framework: str) -> set[str]:
    prefix = f"{framework} :: "
    return {
        c.removeprefix(prefix)
        for c in PROJECT["classifiers"]
        if c.startswith(prefix) and re.fullmatch(r"\d+\.\d+", c.removeprefix(prefix))
    }


def test_the_licence_is_mit_and_ships_in_the_wheel_and_the_sdist() -> None:
    assert PROJECT["license"] == "MIT"
    assert PROJECT["license-files"] == ["LICENSE"]
    assert (REPO / "LICENSE").read_text().startswith("MIT License\n")
    assert "LICENSE" in BUILD["sdist"]["include"]
    # PEP 639 License-Expression and License-File need hatchling 1.27+
    assert "hatchling>=1.27" in PYPROJECT["build-system"]["requires"]


def test_the_classifiers_claim_the_python_versions_the_ci_runs() -> None:
    assert claimed("Programming Language :: Python") == PYTHONS
    assert PROJECT["requires-python"] == ">=3.11"  # the oldest of PYTHONS


def test_the_classifiers_claim_the_django_versions_the_ci_runs() -> None:
    assert claimed("Framework :: Django") == DJANGOS
    assert EXTRAS["django"] == ["django>=5.2"]


def test_the_python_and_django_running_this_test_are_claimed() -> None:
    """The CI runs this file on each interpreter and Django it tests: a new one (a newer
    Django installed by `make matrix`) fails here until its classifier is added."""
    python = "{}.{}".format(*sys.version_info[:2])
    django_version = "{}.{}".format(*django.VERSION[:2])
    assert python in claimed("Programming Language :: Python"), f"add Python {python}"
    assert django_version in claimed("Framework :: Django"), f"add Django {django_version}"


def test_the_extras_are_the_packages_optional_parts_and_the_demo_is_not_one() -> None:
    assert "demo" not in EXTRAS
    assert not any("[demo" in r or ",demo" in r for rs in EXTRAS.values() for r in rs)
    assert EXTRAS["postgres"] == ["psycopg>=3.1"]
    assert EXTRAS["prometheus"] == ["prometheus_client>=0.20"]
    assert EXTRAS["otel"] == ["opentelemetry-api>=1.20"]
    # the tests and the demo project still get what they import
    test = " ".join(EXTRAS["test"])
    for needed in (
        "django-celery-results",
        "redis",
        "psycopg[binary]",
        "dj-database-url",
        "opentelemetry-sdk",
        "opentelemetry-instrumentation-celery",
    ):
        assert needed in test


def test_the_wheel_is_the_package_and_the_sdist_carries_what_the_tests_import() -> None:
    assert BUILD["wheel"]["packages"] == ["celery_deadlines"]
    included = set(BUILD["sdist"]["include"])
    local = {p.stem if p.is_file() else p.name for p in REPO.iterdir() if p.name[0] != "."}
    imported: set[str] = set()
    for path in (REPO / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    needed = (imported & local) | {"tests", "docs", "LICENSE", "README.md", "CHANGELOG.md"}
    assert {"celery_deadlines", "tests", "demo_project", "compat"} <= needed
    assert needed - {name.removesuffix(".py") for name in included} == set()


@pytest.mark.parametrize("point", _crashpoints.POINTS)
def test_a_crash_point_without_a_plan_does_no_work(
    point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """_crashpoints ships in the wheel (the package calls it): unless the process started
    with CELERY_DEADLINES_TESTING_CRASHPOINTS_FILE, a hit is one comparison, no I/O."""

    def fire(*args: object) -> None:
        raise AssertionError("a crash point did work without a plan")

    monkeypatch.setattr(_crashpoints, "_fire", fire)
    assert _crashpoints._plan_file is None
    _crashpoints.hit(point, "run-1")
    _crashpoints.hit("not.a.point", "run-1")  # not even the name is checked


def test_the_version_is_written_once_and_the_changelog_dates_its_section() -> None:
    import celery_deadlines

    version = celery_deadlines.__version__
    assert "version" not in PROJECT
    assert PROJECT["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["hatch"]["version"] == {"path": "celery_deadlines/__init__.py"}
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M)
    # a changelog of releases: every version's section says what was added, changed,
    # fixed and what an upgrading project must do under those four headings only
    headings = set(re.findall(r"^### (.+)$", changelog, re.M))
    assert headings <= {"Added", "Changed", "Fixed", "Upgrading", "Removed", "Deprecated"}


def test_the_install_steps_name_this_versions_sdist() -> None:
    import celery_deadlines

    sdist = f"celery_deadlines-{celery_deadlines.__version__}.tar.gz"
    for page in (REPO / "README.md", REPO / "docs" / "quickstart.md"):
        named = set(re.findall(r"celery_deadlines-[\w.]+\.tar\.gz", page.read_text()))
        assert named == {sdist}, page.name
