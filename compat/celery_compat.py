"""Celery's own unit tests, with DeadlineTask as the app's default task class.

``make celery-compat`` (or ``.venv/bin/python compat/celery_compat.py [TEST PATH...]``):

1. downloads the sdist of the Celery release installed here (``pip download
   --no-binary :all: --no-deps celery==X``) into ``.celery-compat/`` (gitignored) and
   extracts its tests (``t/``, the pytest settings in ``pyproject.toml``, ``requirements/``);
2. builds a virtualenv there: that Celery release with the versions of its dependencies
   installed here, and the test requirements the selected tests need, at the versions
   Celery's ``requirements/`` pin (pytest, pytest-subtests, pytest-timeout, freezegun,
   pydantic); celery_deadlines itself is imported from this work tree;
3. runs the selected tests twice, side by side: with ``celery.Task`` as the default task
   class (the baseline) and with ``celery_deadlines.task:DeadlineTask``
   (``compat/celery_compat_plugin.py`` sets it, as ``Celery(task_cls=...)`` would);
4. fails when a test fails (or errors) under DeadlineTask but not under ``celery.Task``.

Everything is cached under ``.celery-compat/``; a second run only runs the tests.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("CELERY_COMPAT_CACHE", REPO / ".celery-compat"))
DEADLINE_TASK_CLS = "celery_deadlines.task:DeadlineTask"

#: Celery's tests of what a task class changes: the task (``tasks/test_tasks.py``),
#: tracing (``tasks/test_trace.py``), canvas, chords, stamping, results and the request
#: context (``tasks/``); canvas primitives (``test_canvas.py``); the built-in tasks and
#: the app's task decorator (``app/``); the worker's request and strategies (``worker/``,
#: which use the task class's ``Request``); and ``start_worker`` (``contrib/``).
TESTS = (
    "t/unit/tasks",
    "t/unit/test_canvas.py",
    "t/unit/app/test_builtins.py",
    "t/unit/app/test_app.py",
    "t/unit/worker/test_request.py",
    "t/unit/worker/test_strategy.py",
    "t/unit/contrib/test_worker.py",
)

#: Celery's test requirements these tests need, pinned as Celery's requirements/ pin them
NEEDED = ("pytest", "pytest-subtests", "pytest-timeout", "freezegun", "pydantic")
REQUIREMENT_FILES = ("requirements/test.txt", "requirements/extras/pydantic.txt")

#: Left out, with the reason: they test something a task class does not change, and
#: need what this runner does not install.
DESELECTED = {
    # app.setup_security() needs the cryptography package (Celery's "auth" extra)
    "t/unit/app/test_app.py::test_App::test_setup_security",
}

RANK = {"skipped": 0, "passed": 1, "failed": 2, "error": 3}
DESCRIPTION = "Celery's own unit tests, with DeadlineTask as the app's default task class."


class Run(NamedTuple):
    name: str
    task_cls: str | None
    outcomes: Path
    log: Path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("tests", nargs="*", help=f"test paths (default: {' '.join(TESTS)})")
    options = parser.parse_args(argv)
    started = time.monotonic()
    CACHE.mkdir(parents=True, exist_ok=True)
    version = importlib.metadata.version("celery")
    source = extract(sdist(version), CACHE / f"celery-{version}")
    python = virtualenv(version, source)
    prepared = time.monotonic()
    print(f"celery-compat: Celery {version}, prepared in {prepared - started:.0f} s", flush=True)
    runs = [
        Run("celery.Task", None, CACHE / "baseline.json", CACHE / "baseline.log"),
        Run("DeadlineTask", DEADLINE_TASK_CLS, CACHE / "deadline.json", CACHE / "deadline.log"),
    ]
    codes = run_side_by_side(python, source, runs, options.tests or list(TESTS))
    results = {run.name: _load(run.outcomes) for run in runs}
    for run in runs:
        print(f"  {run.name:<13} {summary(results[run.name]['outcomes'])}  (log: {run.log})")
    if results["DeadlineTask"]["apps_with_task_cls"] == 0:
        print("celery-compat: no test app was created with DeadlineTask: the hook did not take")
        return 2
    found = regressions(results["celery.Task"]["outcomes"], results["DeadlineTask"]["outcomes"])
    for nodeid, outcome in found.items():
        print(f"\n--- {outcome} under DeadlineTask only: {nodeid}")
        print(results["DeadlineTask"]["details"].get(nodeid, "(no details)"))
    elapsed = time.monotonic() - started
    print(
        f"celery-compat: {len(found)} test(s) fail with DeadlineTask and not with celery.Task; "
        f"tests took {elapsed - (prepared - started):.0f} s, {elapsed:.0f} s in all"
    )
    if any(code not in (0, 1) for code in codes):  # 1: some tests failed (compared above)
        print(f"celery-compat: pytest exited with {codes}: see the logs")
        return 2
    return 1 if found else 0


def sdist(version: str, project: str = "celery") -> Path:
    """The sdist of ``project`` (Celery's unless named) for ``version``, downloaded once."""
    where = CACHE / "sdist"
    # an sdist's file name spells the project's dashes as underscores, or keeps them
    names = sorted({f"{project}-{version}.tar.gz", f"{project.replace('-', '_')}-{version}.tar.gz"})
    found = sorted(path for name in names for path in where.glob(name))
    if found:
        return found[0]
    where.mkdir(parents=True, exist_ok=True)
    print(f"compat: downloading the sdist of {project}=={version}", flush=True)
    download = ["download", "--quiet", "--no-binary", ":all:", "--no-deps", "--dest", str(where)]
    _check(sys.executable, "-m", "pip", *download, f"{project}=={version}")
    found = sorted(path for name in names for path in where.glob(name))
    if not found:
        raise SystemExit(f"compat: no {names[0]} in {where}")
    return found[0]


def extract(archive: Path, target: Path, settings: tuple[str, ...] = ("pyproject.toml",)) -> Path:
    """The tests (``t/``, ``requirements/``) and the pytest settings (``settings``: the
    files at the archive's root that hold them) from ``archive``, into ``target`` (once)."""
    if (target / ".extracted").exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(dir=CACHE))
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            _, _, inner = member.name.partition("/")
            if inner.startswith(("t/", "requirements/")) or inner in settings:
                member.name = inner
                members.append(member)
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4+: refuse links out of staging
            tar.extractall(staging, members=members, filter="data")
        else:  # pragma: no cover
            tar.extractall(staging, members=members)
    (staging / ".extracted").write_text(archive.name)
    staging.rename(target)
    return target


def virtualenv(version: str, source: Path) -> Path:
    """The python of a virtualenv with Celery ``version`` and its test requirements."""
    wanted = [f"celery=={version}", *dependencies(), *test_requirements(source)]
    return built(CACHE / f"venv-{version}", wanted)


def built(venv: Path, wanted: Sequence[str]) -> Path:
    """The python of the virtualenv ``venv`` with the requirements ``wanted`` (built
    again only when they change)."""
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if stamp.exists() and stamp.read_text() == "\n".join(wanted):
        return python
    print(f"compat: building {venv}", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    _check(sys.executable, "-m", "venv", str(venv))
    _check(str(python), "-m", "pip", "install", "--quiet", *wanted)
    stamp.write_text("\n".join(wanted))
    return python


def dependencies(project: str = "celery") -> list[str]:
    """The dependencies of ``project`` (Celery's unless named) at the versions installed
    here (kombu, billiard, ...)."""
    pinned = []
    for requirement in importlib.metadata.requires(project) or []:
        if "extra ==" in requirement:
            continue
        name = re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0]
        try:
            pinned.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue  # excluded by its marker here
    return pinned


def test_requirements(source: Path) -> list[str]:
    """The :data:`NEEDED` requirements, as Celery's requirements files say them
    (:func:`requirements_of`)."""
    return requirements_of(source, NEEDED, REQUIREMENT_FILES)


def requirements_of(source: Path, needed: Sequence[str], files: Sequence[str]) -> list[str]:
    """The ``needed`` requirements, as the project's requirements ``files`` say them
    (every line of one, markers and all: pip keeps the lines whose markers hold here),
    else unpinned; pytest-subtests only where Celery asks for it (pytest 9 has
    subtests)."""
    found: dict[str, list[str]] = {}
    for relative in files:
        path = source / relative
        lines = path.read_text().splitlines() if path.exists() else []
        for line in lines:
            line = line.split("#", 1)[0].strip()
            name = re.split(r"[\s<>=!~;\[]", line, maxsplit=1)[0].lower()
            if name in needed:
                found.setdefault(name, []).append(line)
    requirements = []
    for name in needed:
        requirements += found.get(name, [] if name == "pytest-subtests" else [name])
    return requirements


def run_side_by_side(
    python: Path, source: Path, runs: Sequence[Run], tests: Sequence[str]
) -> list[int]:
    """Run pytest once per ``runs`` item, at the same time; their exit codes."""
    processes = []
    for run in runs:
        run.outcomes.unlink(missing_ok=True)
        command = [str(python), "-m", "pytest", *tests, "-q", "--timeout", "300"]
        command += ["-p", "no:cacheprovider", "-p", "celery_compat_plugin"]
        command += ["--rootdir", str(source), "-c", str(source / "pyproject.toml")]
        command += [f"--deselect={nodeid}" for nodeid in sorted(DESELECTED)]
        with run.log.open("w") as log:
            processes.append(
                subprocess.Popen(
                    command, cwd=source, env=environment(run), stdout=log, stderr=subprocess.STDOUT
                )
            )
    return [process.wait() for process in processes]


def environment(run: Run) -> dict[str, str]:
    """This environment without Celery's or Django's settings; the plugin's variables."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CELERY_", "DJANGO_")) and key != "PYTHONPATH"
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # two sessions share the test sources
    env["CELERY_COMPAT_OUTCOMES"] = str(run.outcomes)
    if run.task_cls is None:
        env["PYTHONPATH"] = str(HERE)  # the plugin only: celery_deadlines is not imported
    else:
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO)])
        env["CELERY_COMPAT_TASK_CLS"] = run.task_cls
    return env


def regressions(baseline: Mapping[str, str], deadline: Mapping[str, str]) -> dict[str, str]:
    """Tests that fail or error with DeadlineTask and not with celery.Task (a test the
    DeadlineTask run lost, or could not collect, counts too)."""
    found = {}
    for nodeid, outcome in deadline.items():
        if RANK[outcome] >= RANK["failed"] and RANK[baseline.get(nodeid, "passed")] < RANK[outcome]:
            found[nodeid] = outcome
    for nodeid, outcome in baseline.items():
        if outcome == "passed" and nodeid not in deadline:
            found[nodeid] = "missing"
    return found


def summary(outcomes: Mapping[str, str]) -> str:
    counts = dict.fromkeys(RANK, 0)
    for outcome in outcomes.values():
        counts[outcome] += 1
    return ", ".join(f"{counts[name]} {name}" for name in ("passed", "failed", "error", "skipped"))


def _load(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise SystemExit(f"celery-compat: {path} was not written: see the log beside it")
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def _check(*command: str) -> None:
    subprocess.run(command, check=True, cwd=REPO)


if __name__ == "__main__":
    sys.exit(main())
