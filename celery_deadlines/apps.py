"""The Django app: ``"celery_deadlines"`` in ``INSTALLED_APPS``."""

from __future__ import annotations

from django.apps import AppConfig


class CeleryDeadlinesConfig(AppConfig):
    name = "celery_deadlines"
    label = "celery_deadlines"
    verbose_name = "Celery deadlines"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed

        from . import checks
        from .core import preflight  # checks: registers the system checks
        from .install import install
        from .ledger import worker
        from .task import graft_call_onto_deadline_task

        install()
        preflight.use_system_checks(checks.errors)  # a worker or beat starts on none
        graft_call_onto_deadline_task()
        worker.connect()
        setting_changed.connect(_reload_settings, dispatch_uid="celery_deadlines.reload")


def _reload_settings(setting: str, **kwargs: object) -> None:
    if setting.startswith("CELERY_DEADLINES_"):
        from .conf import reload_all

        reload_all()
