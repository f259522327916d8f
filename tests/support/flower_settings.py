"""Django settings of the workers beside Flower and django-celery-results: the run
ledger on PostgreSQL (:mod:`tests.support.ledger_settings`), and django-celery-results'
table in the same database, for the workers whose result backend is ``django-db``."""

from __future__ import annotations

from tests.support.ledger_settings import *  # noqa: F403

INSTALLED_APPS = ["django_celery_results", "celery_deadlines"]
