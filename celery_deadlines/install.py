"""Connect the publish hook, the worker's metrics exporter and its time limits, the
check a worker and beat start with, and put the workflow gate on Celery's canvas
classes, once per process (idempotent, no import side effects)."""

from __future__ import annotations

from celery.signals import before_task_publish

from . import canvas, exporter, pools, preflight, sentry, timelimits
from .propagation import on_before_task_publish

_DISPATCH_UID = "celery_deadlines.propagation.on_before_task_publish"


def install() -> None:
    """Connect the ``before_task_publish`` receiver that stamps and propagates deadlines,
    the worker signals that serve metrics when ``deadlines_metrics_port`` is set, and
    the workflow gate around ``apply_async`` of Celery's chain, group and chord
    (:mod:`celery_deadlines.canvas`), and, in a worker, one event-loop timer for every
    job's time limits (:mod:`celery_deadlines.timelimits`), and the ``task_failure``
    receiver that gives Sentry's transaction of a refused run its status
    (:mod:`celery_deadlines.sentry`; it imports nothing of Sentry's), and the worker
    signals that say whether a process runs its attempts one at a time
    (:mod:`celery_deadlines.pools`), and the check that keeps a worker or beat from
    starting on a configuration the library's checks reject
    (:mod:`celery_deadlines.preflight`).

    Called for you when a :class:`DeadlineTask` is bound to an app and when the Django
    app is ready; call it yourself in a process that only sends tasks by name.
    """
    before_task_publish.connect(on_before_task_publish, dispatch_uid=_DISPATCH_UID, weak=False)
    exporter.connect()
    canvas.patch()
    timelimits.connect()
    sentry.connect()
    pools.connect()
    preflight.connect()
