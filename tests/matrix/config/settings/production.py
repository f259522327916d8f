"""Production, shaped like cookiecutter-django's ``config/settings/production.py``:
persistent connections (``CONN_MAX_AGE``, 60 s by default)."""

from __future__ import annotations

import os

from .base import *  # noqa: F403
from .base import DATABASES, row_settings

DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ.get("CONN_MAX_AGE", "60"))

row_settings(globals())
