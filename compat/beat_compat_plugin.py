"""pytest plugin for django-celery-beat's own scheduler tests (``make beat-compat``, see
beat_compat.py), loaded with ``-p beat_compat_plugin`` in both runs:

* ``BEAT_COMPAT_SCHEDULER``
  (``celery_deadlines.contrib.django_celery_beat:DatabaseDeadlineScheduler``) takes
  ``django_celery_beat.schedulers.DatabaseScheduler``'s place once Django is set
  up, before the tests import the module: every scheduler they make, and every subclass
  they define of it, is that class. Unset: django-celery-beat's own (the baseline).
* ``BEAT_COMPAT_SCHEDULERS`` names a JSON file that receives how many schedulers of that
  class the tests made (none would mean the swap did not take).

Each test's outcome is recorded by ``celery_compat_plugin``.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

SCHEDULER_ENV = "BEAT_COMPAT_SCHEDULER"
COUNT_ENV = "BEAT_COMPAT_SCHEDULERS"

_made = {"schedulers": 0}


@pytest.hookimpl(trylast=True)  # after pytest-django has set Django up
def pytest_configure(config: pytest.Config) -> None:
    wanted = os.environ.get(SCHEDULER_ENV)
    if not wanted:
        return
    module, _, name = wanted.partition(":")
    scheduler: Any = getattr(importlib.import_module(module), name)
    init = scheduler.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _made["schedulers"] += 1
        init(self, *args, **kwargs)

    scheduler.__init__ = __init__
    from django_celery_beat import schedulers  # type: ignore[import-untyped]

    schedulers.DatabaseScheduler = scheduler


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get(COUNT_ENV)
    if target:
        Path(target).write_text(json.dumps(_made))
