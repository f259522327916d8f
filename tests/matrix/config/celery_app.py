"""The project's Celery app, as cookiecutter-django writes it (``config/celery_app.py``):
configured from Django's settings (namespace ``CELERY``), tasks found by autodiscovery.
A worker runs ``celery -A tests.matrix.config.celery_app worker``."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.matrix.config.settings.production")

app = Celery("matrix")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
