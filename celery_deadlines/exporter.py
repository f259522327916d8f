"""A worker's own metrics exporter: ``deadlines_metrics_port``, in Celery's worker signals.

With the setting (Django: ``CELERY_DEADLINES_METRICS_PORT``), a ``celery worker`` whose
app has DeadlineTasks:

* installs the metrics (:func:`celery_deadlines.metrics.install`) in its main process
  at ``worker_init``, before the pool forks, so every pool process counts too (and
  again at ``worker_process_init``, for a pool whose processes do not fork);
* serves them from its main process at ``worker_ready``, on the address
  ``deadlines_metrics_address`` names (``127.0.0.1`` unless set: this machine only)
  (:func:`celery_deadlines.metrics.serve`): with ``PROMETHEUS_MULTIPROC_DIR`` set,
  prometheus_client's multiprocess exposition, where the live gauges of pool processes
  that exited are marked dead.

Nothing here stops a worker: without prometheus_client it logs an ERROR naming the
extra to install and runs without metrics; a port that cannot be bound is logged at
ERROR too. A bad port (``celery_deadlines.E001``) keeps the worker from starting
(:mod:`celery_deadlines.preflight`); where a project silences that check, it is the
setting's :class:`ConfigurationError`, logged here at ERROR.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import current_app
from celery.signals import worker_init, worker_process_init, worker_ready

from . import conf
from .conf import settings_for
from .errors import ConfigurationError

logger = logging.getLogger("celery_deadlines")

#: What to install for the metrics.
EXTRA = "pip install 'celery-deadlines[prometheus]'"


def connect() -> None:
    """Connect the worker signals (idempotent; called by :func:`celery_deadlines.install`)."""
    for signal, receiver, uid in (
        (worker_init, _install_in_main_process, "install"),
        (worker_process_init, _install_in_pool_process, "install_in_pool"),
        (worker_ready, _serve, "serve"),
    ):
        signal.connect(receiver, dispatch_uid=f"celery_deadlines.exporter.{uid}", weak=False)


def port_of(app: Any) -> int | None:
    """The port ``app``'s workers serve their metrics on (``None``: not served), or the
    setting's :class:`ConfigurationError`."""
    return settings_for(app).get(conf.METRICS_PORT)


def _install(app: Any) -> None:
    """Install the metrics in this process if ``app``'s workers serve them (silently
    otherwise: :func:`_serve` reports a bad setting or a missing extra, once)."""
    try:
        if port_of(app) is None:
            return
        from . import metrics
    except ConfigurationError:
        return
    metrics.install()


def _install_in_main_process(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None:
        _install(app)


def _install_in_pool_process(**_: Any) -> None:
    _install(current_app)  # a pool process's current app is its worker's


def _serve(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is None:
        return
    try:
        port = port_of(app)
        address = settings_for(app).get(conf.METRICS_ADDRESS) if port is not None else ""
    except ConfigurationError as exc:
        logger.error("metrics not served: %s", exc)
        return
    if port is None:
        return
    try:
        from . import metrics
    except ConfigurationError:
        logger.error(
            "metrics not served: %s is %s but prometheus_client is not installed; %s",
            conf.METRICS_PORT.describe(),
            port,
            EXTRA,
        )
        return
    try:
        metrics.serve(port, address)
    except OSError as exc:
        logger.error("metrics not served: %s port %s: %s", address, port, exc)
        return
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    logger.info(
        "metrics served on %s port %s%s",
        address,
        port,
        f" (multiprocess mode, {directory})" if directory else " (this process only)",
    )
