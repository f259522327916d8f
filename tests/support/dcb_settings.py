"""Django settings of a ``celery beat`` subprocess with django-celery-beat's scheduler:
the ledger workers' (the run ledger on PostgreSQL), with django-celery-beat's tables in
the same database."""

from __future__ import annotations

from tests.support.ledger_settings import *  # noqa: F403
from tests.support.ledger_settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "django_celery_beat"]
