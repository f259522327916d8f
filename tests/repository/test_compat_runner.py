"""``make celery-compat`` (compat/celery_compat.py): how the two runs of Celery's own
tests are compared, and what the plugin records (the runs themselves are the target's)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from compat import celery_compat
from compat.celery_compat import regressions, summary


def test_a_test_failing_only_under_deadline_task_is_a_regression() -> None:
    baseline = {"t::a": "passed", "t::b": "passed"}
    deadline = {"t::a": "passed", "t::b": "failed"}
    assert regressions(baseline, deadline) == {"t::b": "failed"}


def test_a_test_failing_under_both_task_classes_is_not_a_regression() -> None:
    assert regressions({"t::a": "failed"}, {"t::a": "failed"}) == {}


def test_an_error_where_the_baseline_only_failed_is_a_regression() -> None:
    assert regressions({"t::a": "failed"}, {"t::a": "error"}) == {"t::a": "error"}


def test_a_test_the_deadline_task_run_lost_is_a_regression() -> None:
    assert regressions({"t::a": "passed", "t::b": "skipped"}, {}) == {"t::a": "missing"}


def test_a_module_that_cannot_be_collected_under_deadline_task_is_a_regression() -> None:
    assert regressions({}, {"t/unit/x.py": "error"}) == {"t/unit/x.py": "error"}


def test_the_summary_counts_each_outcome() -> None:
    outcomes = {"a": "passed", "b": "passed", "c": "failed", "d": "skipped"}
    assert summary(outcomes) == "2 passed, 1 failed, 0 error, 1 skipped"


def test_test_requirements_are_pinned_as_celery_pins_them(tmp_path: Path) -> None:
    (tmp_path / "requirements" / "extras").mkdir(parents=True)
    (tmp_path / "requirements" / "test.txt").write_text(
        "pytest==9.1.1\npytest-celery[all]>=1.3.0\npytest-timeout==2.4.0  # per test\n"
        "freezegun==1.5.5\nmoto==5.2.3\n"
    )
    (tmp_path / "requirements" / "extras" / "pydantic.txt").write_text("pydantic==2.14.1\n")
    assert celery_compat.test_requirements(tmp_path) == [
        "pytest==9.1.1",
        "pytest-timeout==2.4.0",
        "freezegun==1.5.5",
        "pydantic==2.14.1",
    ]


def test_every_line_of_a_requirement_is_kept_for_pip_to_judge_its_markers(
    tmp_path: Path,
) -> None:
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "test.txt").write_text(
        "pytest==8.3.5\n"
        'pytest-subtests<0.14.0; python_version < "3.9"\n'
        'pytest-subtests>=0.14.1; python_version >= "3.9"\n'
    )
    assert celery_compat.test_requirements(tmp_path) == [
        "pytest==8.3.5",
        'pytest-subtests<0.14.0; python_version < "3.9"',
        'pytest-subtests>=0.14.1; python_version >= "3.9"',
        "pytest-timeout",
        "freezegun",
        "pydantic",
    ]


def test_only_the_tests_and_their_settings_are_extracted_from_the_sdist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "celery-9.9.9.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in ("t/unit/conftest.py", "pyproject.toml", "celery/__init__.py", "setup.py"):
            data = b"# " + name.encode() + b"\n"
            member = tarfile.TarInfo(f"celery-9.9.9/{name}")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    monkeypatch.setattr(celery_compat, "CACHE", tmp_path)
    source = celery_compat.extract(archive, tmp_path / "celery-9.9.9")
    found = sorted(str(path.relative_to(source)) for path in source.rglob("*") if path.is_file())
    # never Celery's source: the tests must import the Celery that is installed
    assert found == [".extracted", "pyproject.toml", "t/unit/conftest.py"]


def test_an_sdist_whose_name_spells_dashes_as_underscores_is_found_not_downloaded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sdist").mkdir()
    kept = tmp_path / "sdist" / "django_celery_beat-2.9.0.tar.gz"
    kept.touch()
    monkeypatch.setattr(celery_compat, "CACHE", tmp_path)
    monkeypatch.setattr(celery_compat, "_check", lambda *command: pytest.fail("downloaded"))
    assert celery_compat.sdist("2.9.0", "django-celery-beat") == kept


def test_a_projects_pytest_settings_are_extracted_from_the_file_that_holds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "django_celery_beat-9.9.9.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in ("t/unit/test_schedulers.py", "setup.cfg", "django_celery_beat/models.py"):
            data = b"# " + name.encode() + b"\n"
            member = tarfile.TarInfo(f"django_celery_beat-9.9.9/{name}")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    monkeypatch.setattr(celery_compat, "CACHE", tmp_path)
    source = celery_compat.extract(archive, tmp_path / "dcb", settings=("setup.cfg",))
    found = sorted(str(path.relative_to(source)) for path in source.rglob("*") if path.is_file())
    assert found == [".extracted", "setup.cfg", "t/unit/test_schedulers.py"]


def test_the_integration_runs_each_have_a_redis_server_and_only_the_deadline_run_a_budget(
    tmp_path: Path,
) -> None:
    from compat import celery_integration

    baseline = celery_integration.Run("celery.Task", None, {}, tmp_path / "b.json", tmp_path / "b")
    deadline = celery_integration.Run(
        "DeadlineTask",
        celery_compat.DEADLINE_TASK_CLS,
        {"deadlines_default_budget": 300.0},
        tmp_path / "d.json",
        tmp_path / "d",
    )
    base_env = celery_integration.environment(baseline, 7001)
    deadline_env = celery_integration.environment(deadline, 7002)
    assert (base_env["TEST_BROKER"], base_env["TEST_BACKEND"]) == (
        "redis://127.0.0.1:7001/0",
        "redis://127.0.0.1:7001/1",
    )
    assert deadline_env["TEST_BROKER"] == "redis://127.0.0.1:7002/0"
    # Celery's tasks keep their own keys on the run's server too
    assert (base_env["REDIS_HOST"], base_env["REDIS_PORT"]) == ("127.0.0.1", "7001")
    assert deadline_env["REDIS_PORT"] == "7002"
    assert "CELERY_COMPAT_DEFAULTS" not in base_env
    assert "CELERY_COMPAT_TASK_CLS" not in base_env
    assert deadline_env["CELERY_COMPAT_DEFAULTS"] == '{"deadlines_default_budget": 300.0}'
