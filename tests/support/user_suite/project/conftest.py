"""The bakery's fixtures: Celery's pytest fixtures, and celery-deadlines' plugin."""

pytest_plugins = ["celery.contrib.pytest", "celery_deadlines.pytest_plugin"]
