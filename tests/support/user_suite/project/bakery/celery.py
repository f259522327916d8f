"""The bakery's Celery app, configured from Django's settings (``CELERY_*``)."""

from celery import Celery

app = Celery("bakery")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
