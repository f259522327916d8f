"""Worker signals of the Django tier: reconcile at start, periodically, and on loss.

Connected by the Django app's ``ready()``; they act only in a ``celery worker`` whose
app has DeadlineTasks, and only while the ledger is active.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from celery.signals import worker_ready, worker_shutdown

from .. import conf
from ..conf import settings_for
from .api import store_for
from .clockwatch import ClockWatch
from .reconcile import Reconciler, running

logger = logging.getLogger("celery_deadlines")


#: How often the clock is measured when a skew budget is set without a reconcile interval.
CLOCK_CHECK_INTERVAL = timedelta(seconds=10)


def connect() -> None:
    worker_ready.connect(_start, dispatch_uid="celery_deadlines.ledger.start", weak=False)
    worker_shutdown.connect(_stop, dispatch_uid="celery_deadlines.ledger.stop", weak=False)


def _start(sender: Any = None, **_: Any) -> None:
    from . import enabled_for

    app = getattr(sender, "app", None)
    if app is None or not enabled_for(app) or running() is not None:
        return
    settings = settings_for(app)
    interval = settings.get(conf.RECONCILE_INTERVAL)
    store = store_for(app, dedicated=True)
    budget = settings.get(conf.CLOCK_SKEW_BUDGET)
    watch = ClockWatch(store, budget, sender) if budget is not None else None
    if watch is not None and interval is None:
        # a clock measured once proves nothing later, and runs held for it need a worker
        # whose clock agrees to publish them again
        interval = CLOCK_CHECK_INTERVAL
        logger.warning(
            "deadlines_clock_skew_budget is set but deadlines_reconcile_interval is None: "
            "the clock is measured (and the ledger reconciled) every %s s",
            interval.total_seconds(),
        )
    Reconciler(app, store, interval, watch).start()
    logger.info(
        "run ledger reconciler started (every %s)%s",
        interval or "start only",
        f"; clock skew budget {budget.total_seconds()} s" if budget is not None else "",
    )


def _stop(**_: Any) -> None:
    reconciler = running()
    if reconciler is not None:
        reconciler.stop()
