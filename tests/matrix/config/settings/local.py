"""Local development, shaped like cookiecutter-django's ``config/settings/local.py``
(without Docker): tasks run eagerly, in the process that calls them, and raise there."""

from __future__ import annotations

from .base import *  # noqa: F403
from .base import row_settings

DEBUG = True
CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True

row_settings(globals())
