"""Django settings of the eager site's second process (tests/support/eager_site.py):
the test session's, on the test database its first process uses (``EAGER_DATABASE``
names the alias, ``EAGER_DATABASE_NAME`` that alias's test database)."""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

DATABASES[os.environ["EAGER_DATABASE"]]["NAME"] = os.environ["EAGER_DATABASE_NAME"]
