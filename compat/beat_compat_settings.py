"""django-celery-beat's test settings (``t.proj.settings``) with the library's Django
app installed, as DatabaseDeadlineScheduler needs it: the swap run of ``make
beat-compat`` (compat/beat_compat.py)."""

from __future__ import annotations

import importlib
from typing import Any

_theirs: Any = importlib.import_module("t.proj.settings")

globals().update({name: value for name, value in vars(_theirs).items() if name.isupper()})
INSTALLED_APPS = [*_theirs.INSTALLED_APPS, "celery_deadlines"]
