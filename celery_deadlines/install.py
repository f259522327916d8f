"""Connect the library to Celery and the integrations to the library, once per process
(idempotent, no import side effects)."""

from __future__ import annotations

from celery.signals import before_task_publish

from .contrib import opentelemetry, prometheus, sentry
from .core import (
    cancelling,
    canvas,
    pools,
    preflight,
    request,
    resultpipes,
    telemetry,
    timelimits,
    workload,
)
from .core.publishing import on_before_task_publish

_DISPATCH_UID = "celery_deadlines.core.publishing.on_before_task_publish"


def install() -> None:
    """Connect the ``before_task_publish`` receiver that stamps and propagates deadlines,
    put the workflow gate around ``apply_async`` of Celery's chain, group and chord
    (:mod:`celery_deadlines.core.canvas`), keep a message whose task name no task can
    have from stopping a worker's consumer (:class:`~celery_deadlines.core.request.Strategies`),
    and connect the worker signals: one event-loop
    timer for every job's time limits (:mod:`celery_deadlines.core.timelimits`), a prefork
    pool's result pipes that cannot stop the worker when a pool process dies in the middle
    of a message (:mod:`celery_deadlines.core.resultpipes`), whether
    a process runs its attempts one at a time (:mod:`celery_deadlines.core.pools`), and
    the check that keeps a worker or beat from starting on a configuration the library's
    checks reject (:mod:`celery_deadlines.core.preflight`), and the report of the work a
    worker holds per queue, by which a publish is judged against the queue ahead
    (:mod:`celery_deadlines.core.workload`).

    And wire in the integrations, none of which the Celery tier imports: deadlines and
    refusals on OpenTelemetry's spans (:mod:`celery_deadlines.contrib.opentelemetry`; it
    imports nothing of OpenTelemetry's), the worker's metrics exporter when
    ``deadlines_metrics_port`` is set (:mod:`celery_deadlines.contrib.prometheus`), and
    the ``task_failure`` receiver that gives Sentry's transaction of a refused run its
    status (:mod:`celery_deadlines.contrib.sentry`; it imports nothing of Sentry's).

    Called for you when a :class:`DeadlineTask` is bound to an app and when the Django
    app is ready; call it yourself in a process that only sends tasks by name.
    """
    before_task_publish.connect(on_before_task_publish, dispatch_uid=_DISPATCH_UID, weak=False)
    canvas.patch()
    request.guard_consumers()
    timelimits.connect()
    resultpipes.connect()
    cancelling.connect()
    pools.connect()
    preflight.connect()
    workload.connect()
    telemetry.wire(opentelemetry)
    prometheus.connect()
    sentry.connect()
