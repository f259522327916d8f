"""The demo project: a small shop whose orders run under one deadline."""

from .celery import app as celery_app

__all__ = ["celery_app"]
