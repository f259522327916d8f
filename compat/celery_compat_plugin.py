"""pytest plugin for Celery's own unit tests (``make celery-compat``, see celery_compat.py).

Loaded with ``-p celery_compat_plugin`` in both runs:

* ``CELERY_COMPAT_TASK_CLS`` (e.g. ``celery_deadlines.task:DeadlineTask``) becomes the
  default task class of every Celery app the tests create, as ``Celery(task_cls=...)``
  would make it: the ``celery_app`` fixture's ``TestApp``, the test classes'
  ``self.Celery`` and plain ``Celery(...)`` alike. An app that names a task class of its
  own (the argument, or a subclass's ``task_cls``) keeps it. Unset: Celery's default
  (``celery.Task``), the baseline.
* ``CELERY_COMPAT_DEFAULTS`` (a JSON object, e.g. ``{"deadlines_default_budget": 300}``)
  becomes defaults of every app the tests create (``app.add_defaults``: the tests' own
  configuration still overrides them). Unset: none.
* ``CELERY_COMPAT_OUTCOMES`` names a JSON file that receives each test's outcome
  (``passed``, ``failed``, ``error``, ``skipped``), for the runner to compare the runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

TASK_CLS_ENV = "CELERY_COMPAT_TASK_CLS"
DEFAULTS_ENV = "CELERY_COMPAT_DEFAULTS"
OUTCOMES_ENV = "CELERY_COMPAT_OUTCOMES"

#: how bad an outcome is: a test's worst phase (setup, call, teardown) is its outcome
_RANK = {"skipped": 0, "passed": 1, "failed": 2, "error": 3}

_outcomes: dict[str, str] = {}
_details: dict[str, str] = {}
_apps = {"with": 0, "own": 0}


def pytest_configure(config: pytest.Config) -> None:
    wanted = os.environ.get(TASK_CLS_ENV)
    defaults = json.loads(os.environ.get(DEFAULTS_ENV) or "{}")
    if wanted or defaults:
        _default_task_cls(wanted, defaults)


def _default_task_cls(wanted: str | None, defaults: dict[str, Any]) -> None:
    """Make ``wanted`` the default task class, and ``defaults`` default settings, of every
    app created from now on."""
    from celery.app.base import Celery

    init: Any = Celery.__init__

    def __init__(self: Celery, *args: Any, task_cls: Any = None, **kwargs: Any) -> None:
        below = type(self).__mro__[: type(self).__mro__.index(Celery)]
        if not wanted:
            pass
        elif task_cls or any("task_cls" in vars(klass) for klass in below):
            _apps["own"] += 1  # the test chose its app's task class: it keeps it
        else:
            task_cls = wanted
            _apps["with"] += 1
        init(self, *args, task_cls=task_cls, **kwargs)
        if defaults:
            self.add_defaults(lambda: dict(defaults))

    Celery.__init__ = __init__  # type: ignore[method-assign, assignment]


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:  # a module that cannot be collected: every test in it is lost
        _record(report.nodeid, "error", report.longreprtext)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped:
        outcome = "skipped"
    elif report.when == "call":
        outcome = "passed"
    else:
        return  # a setup or teardown that passed says nothing of the test
    _record(report.nodeid, outcome, report.longreprtext if report.failed else "")


def _record(nodeid: str, outcome: str, detail: str) -> None:
    if _RANK[outcome] >= _RANK.get(_outcomes.get(nodeid, "skipped"), 0):
        _outcomes[nodeid] = outcome
    if detail:
        _details.setdefault(nodeid, detail[-4000:])


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get(OUTCOMES_ENV)
    if not target:
        return
    wanted = os.environ.get(TASK_CLS_ENV) or "celery.app.task:Task"
    result = {
        "task_cls": wanted,
        "apps_with_task_cls": _apps["with"],
        "apps_with_their_own": _apps["own"],
        "outcomes": _outcomes,
        "details": _details,
    }
    Path(target).write_text(json.dumps(result, indent=1, sort_keys=True))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    wanted = os.environ.get(TASK_CLS_ENV)
    if wanted:
        terminalreporter.write_line(
            f"celery-compat: {_apps['with']} apps created with task_cls={wanted} "
            f"({_apps['own']} named their own)"
        )
