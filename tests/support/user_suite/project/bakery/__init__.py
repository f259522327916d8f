"""A bakery that takes orders: a Django project with a Celery app, as its users have it."""

from .celery import app as celery_app

__all__ = ["celery_app"]
