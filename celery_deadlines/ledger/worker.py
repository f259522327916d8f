"""Worker signals of the Django tier: reconcile at start, periodically, and on loss;
record a run Celery itself ended (revoked, terminated, expired by its ``expires``).

Connected by the Django app's ``ready()``; they act only in a ``celery worker`` whose
app has DeadlineTasks, and only while the ledger is active.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from celery.signals import task_postrun, task_revoked, worker_ready, worker_shutdown

from .. import conf
from ..conf import settings_for
from ..rules.contracts import is_deadline_task
from ..rules.outcomes import ended_by_celery
from . import celery_report
from .api import release_connections, store_for
from .clockwatch import ClockWatch
from .reconcile import Reconciler, running

logger = logging.getLogger("celery_deadlines")


#: How often the clock is measured when a skew budget is set without a reconcile interval.
CLOCK_CHECK_INTERVAL = timedelta(seconds=10)


def connect() -> None:
    worker_ready.connect(_start, dispatch_uid="celery_deadlines.ledger.start", weak=False)
    worker_shutdown.connect(_stop, dispatch_uid="celery_deadlines.ledger.stop", weak=False)
    task_revoked.connect(_revoked, dispatch_uid="celery_deadlines.ledger.revoked", weak=False)
    task_postrun.connect(_job_ended, dispatch_uid="celery_deadlines.ledger.job_ended", weak=False)


def _job_ended(**_: Any) -> None:
    """A job ended in this thread: its dedicated connections go to the next job's thread
    (:meth:`~.sql.connection.Store.release`; on a green pool, the next job's greenlet)."""
    release_connections()


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
    celery_report.attach(sender)  # what the ledger ends is told as this worker would tell it
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
    celery_report.detach()


def _revoked(
    sender: Any = None,
    request: Any = None,
    terminated: bool = False,
    signum: Any = None,
    expired: bool = False,
    **_: Any,
) -> None:
    """Celery ended a DeadlineTask's run in this worker (it stored REVOKED and sent
    ``task-revoked``): the ledger records that end, so that the sweeper neither
    republishes the discarded message nor expires the run later with a refusal that
    says no worker took it. A run already ended, or with an effect of unknown outcome
    (the reconciler asks what happened first), is left as it is."""
    from . import enabled_for

    app = getattr(sender, "app", None)
    task_id = getattr(request, "id", None)
    if app is None or not task_id or not is_deadline_task(sender) or not enabled_for(app):
        return
    status, reason, detail = ended_by_celery(
        expired=bool(expired), terminated=bool(terminated), signum=signum
    )
    try:
        store_for(app).sweeps.end_by_celery(task_id, status, reason, detail)
    except Exception:  # the message is discarded either way; the sweeper ends the run later
        logger.exception("recording that Celery ended run %s failed", task_id)
