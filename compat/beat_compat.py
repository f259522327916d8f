"""django-celery-beat's own scheduler tests, with DatabaseDeadlineScheduler in place of
DatabaseScheduler.

``make beat-compat`` (or ``.venv/bin/python -m compat.beat_compat [TEST PATH...]``):

1. downloads the sdist of the django-celery-beat release installed here into
   ``.celery-compat/`` (as ``make celery-compat`` does Celery's) and extracts its tests
   (``t/``, the pytest settings in ``setup.cfg``, ``requirements/``);
2. builds a virtualenv there: that release with the versions of its dependencies (and
   Celery's) installed here, and the test requirements its ``requirements/test.txt``
   pins (pytest, pytest-django, pytest-timeout, ephem); celery_deadlines itself is
   imported from this work tree;
3. runs ``t/unit/test_schedulers.py`` twice, side by side: as django-celery-beat ships
   it (the baseline), and with ``celery_deadlines`` in ``INSTALLED_APPS`` and
   ``django_celery_beat.schedulers.DatabaseScheduler`` replaced by
   ``celery_deadlines.contrib.django_celery_beat.DatabaseDeadlineScheduler`` before the tests import
   it (``compat/beat_compat_plugin.py``), so that every scheduler the tests make, and
   every subclass they define, is the library's;
4. fails when a test fails (or errors) with the swap but not without it.

Its rows are django-celery-beat's own (``djcelery.unittest.add...``, tasks no app
registers): the swap is judged as the scheduler of rows that are not DeadlineTasks'.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from compat.celery_compat import (
    CACHE,
    HERE,
    REPO,
    _load,
    built,
    dependencies,
    extract,
    regressions,
    requirements_of,
    sdist,
    summary,
)

PROJECT = "django-celery-beat"
TESTS = ("t/unit/test_schedulers.py",)
#: django-celery-beat's test requirements these tests need, pinned as it pins them
NEEDED = ("pytest", "pytest-django", "pytest-timeout", "ephem")
REQUIREMENT_FILES = ("requirements/test.txt",)
SWAPPED = "celery_deadlines.contrib.django_celery_beat:DatabaseDeadlineScheduler"
#: The swap run's Django settings: django-celery-beat's, with the library's app installed
SETTINGS = "beat_compat_settings"
DESCRIPTION = "django-celery-beat's scheduler tests, with DatabaseDeadlineScheduler swapped in."


class Run(NamedTuple):
    name: str
    #: the scheduler class put in DatabaseScheduler's place (``None``: the baseline)
    scheduler: str | None
    outcomes: Path
    log: Path

    @property
    def made(self) -> Path:
        """Where the swap run counts the schedulers of the library's it made."""
        return self.outcomes.with_name(f"{self.outcomes.stem}-schedulers.json")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("tests", nargs="*", help=f"test paths (default: {' '.join(TESTS)})")
    options = parser.parse_args(argv)
    started = time.monotonic()
    CACHE.mkdir(parents=True, exist_ok=True)
    version = importlib.metadata.version(PROJECT)
    archive = sdist(version, PROJECT)
    source = extract(archive, CACHE / f"{PROJECT}-{version}", settings=("setup.cfg",))
    wanted = [
        f"{PROJECT}=={version}",
        *dependencies(PROJECT),
        *dependencies("celery"),
        *requirements_of(source, NEEDED, REQUIREMENT_FILES),
    ]
    python = built(CACHE / f"venv-{PROJECT}-{version}", wanted)
    prepared = time.monotonic()
    print(f"beat-compat: {PROJECT} {version}, prepared in {prepared - started:.0f} s", flush=True)
    runs = [
        Run("DatabaseScheduler", None, CACHE / "beat-baseline.json", CACHE / "beat-baseline.log"),
        Run("swapped", SWAPPED, CACHE / "beat-swapped.json", CACHE / "beat-swapped.log"),
    ]
    codes = run_side_by_side(python, source, runs, options.tests or list(TESTS))
    results = {run.name: _load(run.outcomes) for run in runs}
    for run in runs:
        print(f"  {run.name:<17} {summary(results[run.name]['outcomes'])}  (log: {run.log})")
    made = _load(runs[1].made)["schedulers"]
    if made == 0:
        print("beat-compat: no DatabaseDeadlineScheduler was made: the swap did not take")
        return 2
    found = regressions(results["DatabaseScheduler"]["outcomes"], results["swapped"]["outcomes"])
    for nodeid, outcome in found.items():
        print(f"\n--- {outcome} with DatabaseDeadlineScheduler only: {nodeid}")
        print(results["swapped"]["details"].get(nodeid, "(no details)"))
    elapsed = time.monotonic() - started
    print(
        f"beat-compat: {len(found)} test(s) fail with DatabaseDeadlineScheduler and not with "
        f"DatabaseScheduler ({made} made); tests took {elapsed - (prepared - started):.0f} s, "
        f"{elapsed:.0f} s in all"
    )
    if any(code not in (0, 1) for code in codes):  # 1: some tests failed (compared above)
        print(f"beat-compat: pytest exited with {codes}: see the logs")
        return 2
    return 1 if found else 0


def run_side_by_side(
    python: Path, source: Path, runs: Sequence[Run], tests: Sequence[str]
) -> list[int]:
    """Run pytest once per ``runs`` item, at the same time; their exit codes."""
    processes = []
    for run in runs:
        run.outcomes.unlink(missing_ok=True)
        command = [str(python), "-m", "pytest", *tests, "-q", "--timeout", "300"]
        command += ["-p", "no:cacheprovider", "-p", "celery_compat_plugin"]
        command += ["-p", "beat_compat_plugin"]
        command += ["--rootdir", str(source), "-c", str(source / "setup.cfg")]
        if run.scheduler is not None:
            command += ["--ds", SETTINGS]
        with run.log.open("w") as log:
            processes.append(
                subprocess.Popen(
                    command, cwd=source, env=environment(run), stdout=log, stderr=subprocess.STDOUT
                )
            )
    return [process.wait() for process in processes]


def environment(run: Run) -> dict[str, str]:
    """This environment without Celery's or Django's settings; the plugins' variables."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CELERY_", "DJANGO_")) and key != "PYTHONPATH"
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # two sessions share the test sources
    env["CELERY_COMPAT_OUTCOMES"] = str(run.outcomes)
    if run.scheduler is None:
        env["PYTHONPATH"] = str(HERE)  # the plugins only: celery_deadlines is not imported
    else:
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO)])
        env["BEAT_COMPAT_SCHEDULER"] = run.scheduler
        env["BEAT_COMPAT_SCHEDULERS"] = str(run.made)
    return env


if __name__ == "__main__":
    sys.exit(main())
