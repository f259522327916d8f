"""Worker signals of the Django tier: reconcile at start, periodically, and on loss.

Connected by the Django app's ``ready()``; they act only in a ``celery worker`` whose
app has DeadlineTasks, and only while the ledger is active.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_ready, worker_shutdown

from .. import conf
from ..conf import settings_for
from .glue import store_for
from .reconcile import Reconciler

logger = logging.getLogger("celery_deadlines")

_reconciler: Reconciler | None = None


def connect() -> None:
    worker_ready.connect(_start, dispatch_uid="celery_deadlines.ledger.start", weak=False)
    worker_shutdown.connect(_stop, dispatch_uid="celery_deadlines.ledger.stop", weak=False)


def reconciler() -> Reconciler | None:
    """This worker's reconciler (main process), if it runs."""
    return _reconciler


def _start(sender: Any = None, **_: Any) -> None:
    global _reconciler
    from . import enabled_for

    app = getattr(sender, "app", None)
    if app is None or not enabled_for(app) or _reconciler is not None:
        return
    interval = settings_for(app).get(conf.RECONCILE_INTERVAL)
    _reconciler = Reconciler(app, store_for(app, dedicated=True), interval)
    _reconciler.start()
    logger.info("run ledger reconciler started (every %s)", interval or "start only")


def _stop(**_: Any) -> None:
    global _reconciler
    if _reconciler is not None:
        _reconciler.stop()
        _reconciler = None
