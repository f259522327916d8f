"""The matrix's project, shaped like cookiecutter-django's ``config`` package: its
settings (``settings/base.py``, ``production.py``, ``local.py``), its Celery app
(``celery_app.py``) and its URLs. Each row of the matrix runs it with its own settings
over production's (``MATRIX_SETTINGS``, JSON: see ``settings/base.py``)."""

from .celery_app import app as celery_app

__all__ = ["celery_app"]
