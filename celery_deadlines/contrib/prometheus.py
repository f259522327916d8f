"""Prometheus metrics for what an operator needs to see (the ``prometheus`` extra), and a
worker's own exporter of them.

``pip install 'celery-deadlines[prometheus]'``, then set ``deadlines_metrics_port``
(Django: ``CELERY_DEADLINES_METRICS_PORT``): each worker installs the metrics in every
process and serves them once it is ready (below). Elsewhere (a producer, for enqueue
refusals)::

    from celery_deadlines.contrib import prometheus

    prometheus.install()  # once per process; the metrics join the default registry

Every metric is fed by one of the library's signals (:mod:`celery_deadlines.signals`),
so nothing here is on the path of a decision: a failing exporter never changes one.

* ``celery_deadlines_refusals_total``: gate refusals, by ``task``, ``gate``, ``reason``
  (``deadline_refused``)
* ``celery_deadlines_runs_expired_total``: runs the ledger expired on its own, by
  ``task``, ``reason`` (``run_expired``)
* ``celery_deadlines_dispatch_refusals_total``: side effects the dispatch guard refused,
  by ``reason``
* ``celery_deadlines_fenced_writes_rejected_total``: late writes of stale attempts
  rejected by fencing, by ``write``
* ``celery_deadlines_plan_resumes_total``: plans resumed, by ``verdict`` (continue,
  revalidate, replan) and ``action``
* ``celery_deadlines_queue_wait_seconds``: histogram: claimable to claimed, by ``task``,
  on the ledger's clock
* ``celery_deadlines_runs_held_total``: runs held as CLOCK_UNCERTAIN, by ``task``
* ``celery_deadlines_cancels_total``: cancels made in this process (``celery_deadlines.cancel``,
  ``manage.py deadlines cancel``, the admin), and ``celery_deadlines_runs_cancelled_total``:
  the unended runs those cancels changed (``run_cancelled``); each such run ends
  ``cancelled`` where it is found: a refusal at the claim (``refusals_total``,
  ``reason="cancelled"``), or ``runs_expired_total`` (``reason="cancelled"``: the
  sweeper's, or a running attempt's when its body ends)
* ``celery_deadlines_clock_offset_seconds``: the ledger's clock minus this worker's, at
  the last reading
* ``celery_deadlines_clock_uncertainty_seconds``: half the round trip of that reading
* ``celery_deadlines_clock_readable``: 1 if the last check read the ledger's clock, 0 if
  it could not

**A** ``task`` **label is a registered task's name, or** ``(other)``: the name of the
task that refused (never the message's ``shadow`` name, which its sender chooses), a
name registered in the app, and everything else under the one label :data:`OTHER_TASK`
(a name sent by ``send_task`` that this process does not register, a call to another
service refused outside any task, whose method and host are in the log line). What a
message or a caller's choice of host says never adds a series: the series are bounded
by the code's tasks.

The three clock gauges are **absent until the clock is measured** (a worker of the
ledger tier with ``deadlines_clock_skew_budget`` set measures it every reconcile pass):
a process that measures nothing exports none of them, never a 0 that would read as a
measurement. ``clock_readable`` appears with the first check; ``clock_offset_seconds``
and ``clock_uncertainty_seconds`` only while the last check gave a usable reading.
They are the measuring process's own values (the worker's main process), without a
``pid`` label.

docs/howto/prometheus.md ("Watch it in Prometheus") has the queries. A worker serves the metrics
itself with ``deadlines_metrics_port`` (below), or call :func:`serve`. In a prefork
worker, pool processes count in their own memory: set ``PROMETHEUS_MULTIPROC_DIR`` (an
empty directory) before the worker starts, and :func:`serve` exposes
prometheus_client's multiprocess collector (every process's counts) and, at each
scrape, marks dead the live gauges of processes that exited
(:func:`mark_dead_processes`).

**The worker's exporter** (:func:`connect`, which :func:`celery_deadlines.install`
calls). With ``deadlines_metrics_port``, a ``celery worker`` whose app has DeadlineTasks:

* installs the metrics (:func:`install`) in its main process
  at ``worker_init``, before the pool forks, so every pool process counts too (and
  again at ``worker_process_init``, for a pool whose processes do not fork);
* serves them from its main process at ``worker_ready``, on the address
  ``deadlines_metrics_address`` names (``127.0.0.1`` unless set: this machine only)
  (:func:`serve`): with ``PROMETHEUS_MULTIPROC_DIR`` set,
  prometheus_client's multiprocess exposition, where the live gauges of pool processes
  that exited are marked dead.

Nothing here stops a worker: without prometheus_client it logs an ERROR naming the
extra to install and runs without metrics; a port that cannot be bound is logged at
ERROR too. A bad port (``celery_deadlines.E001``) keeps the worker from starting
(:mod:`celery_deadlines.core.preflight`); where a project silences that check, it is the
setting's :class:`ConfigurationError`, logged here at ERROR.

Importing this module needs nothing of prometheus_client: :func:`install` and
:func:`serve` raise :class:`ConfigurationError` naming the extra when it is missing.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery import Celery, Task, current_app
from celery.signals import worker_init, worker_process_init, worker_ready

from .. import conf, signals
from ..conf import settings_for
from ..errors import ConfigurationError
from ..rules.skew import ClockReading

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
    from prometheus_client.core import GaugeMetricFamily, Metric
except ImportError:  # pragma: no cover - install() and serve() say what to install
    INSTALLED = False
else:
    INSTALLED = True

logger = logging.getLogger("celery_deadlines")

__all__ = ["OTHER_TASK", "install", "serve"]

#: What to install for the metrics.
EXTRA = "pip install 'celery-deadlines[prometheus]'"

#: Queue waits from a millisecond to an hour.
QUEUE_WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600)
#: The ``task`` label of everything that is not a registered task's name.
OTHER_TASK = "(other)"


def task_label(sender: object, task_name: str) -> str:
    """The ``task`` label of a signal from ``sender`` about ``task_name``: the sending
    task's own name, else ``task_name`` if the app (the sender, else the current one)
    registers it, else :data:`OTHER_TASK`."""
    if isinstance(sender, Task):
        name = sender.name
        return name if isinstance(name, str) else OTHER_TASK
    app = sender if isinstance(sender, Celery) else current_app
    try:
        registered = task_name in app.tasks
    except Exception:  # noqa: BLE001 - an app that cannot list its tasks registers none
        registered = False
    return task_name if registered else OTHER_TASK


@dataclass(frozen=True)
class Metrics:
    refusals: Counter
    expired: Counter
    dispatch_refusals: Counter
    fenced_writes_rejected: Counter
    plan_resumes: Counter
    queue_wait: Histogram
    runs_held: Counter
    cancels: Counter
    runs_cancelled: Counter
    clock: ClockGauges


class ClockGauges:
    """The clock gauges of the last reading, as a collector: none before the first
    check, ``clock_readable`` from it on, the offset and its uncertainty while the last
    reading gave them. Plain process memory, never prometheus_client's per-process
    files: a pool process forked after a reading would otherwise report a 0 of its own.
    """

    OFFSET = "celery_deadlines_clock_offset_seconds"
    UNCERTAINTY = "celery_deadlines_clock_uncertainty_seconds"
    READABLE = "celery_deadlines_clock_readable"
    HELP = {
        OFFSET: "The ledger's clock minus this worker's, at the last reading.",
        UNCERTAINTY: "Half the round trip of the last clock reading.",
        READABLE: "1 if the last check read the ledger's clock, 0 if it could not.",
    }

    def __init__(self) -> None:
        #: ``None``: never measured; else the last check's reading (``None`` inside:
        #: the clock could not be read). One assignment, so a scrape sees one reading.
        self._last: tuple[ClockReading | None] | None = None

    def record(self, reading: ClockReading | None) -> None:
        self._last = (reading,)

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(name, text) for name, text in self.HELP.items()]

    def collect(self) -> Iterable[Metric]:
        last = self._last
        if last is None:
            return []
        (reading,) = last
        found = [self._gauge(self.READABLE, 0 if reading is None else 1)]
        if reading is not None and reading.uncertainty != timedelta.max:
            found.append(self._gauge(self.OFFSET, reading.offset.total_seconds()))
            found.append(self._gauge(self.UNCERTAINTY, reading.uncertainty.total_seconds()))
        return found

    def _gauge(self, name: str, value: float) -> Metric:
        return GaugeMetricFamily(name, self.HELP[name], value=value)


def _require() -> None:
    if not INSTALLED:
        raise ConfigurationError(
            f"celery_deadlines.contrib.prometheus needs prometheus_client: {EXTRA}"
        )


#: by registry (kept alive here, so its id() in the receivers' dispatch_uid stays unique)
_installed: dict[CollectorRegistry, Metrics] = {}


def install(registry: CollectorRegistry | None = None) -> Metrics:
    """Create the metrics in ``registry`` (default: prometheus_client's) and feed them
    from the library's signals. Idempotent per registry. Raises
    :class:`ConfigurationError` without prometheus_client."""
    _require()
    registry = registry if registry is not None else REGISTRY
    if registry in _installed:
        return _installed[registry]
    made = Metrics(
        refusals=Counter(
            "celery_deadlines_refusals",
            "Work refused by a deadline gate.",
            ["task", "gate", "reason"],
            registry=registry,
        ),
        expired=Counter(
            "celery_deadlines_runs_expired",
            "Runs the ledger expired on its own, by reason.",
            ["task", "reason"],
            registry=registry,
        ),
        dispatch_refusals=Counter(
            "celery_deadlines_dispatch_refusals",
            "Side effects refused by the dispatch guard.",
            ["reason"],
            registry=registry,
        ),
        fenced_writes_rejected=Counter(
            "celery_deadlines_fenced_writes_rejected",
            "Writes of attempts that lost their lease, rejected by fencing.",
            ["write"],
            registry=registry,
        ),
        plan_resumes=Counter(
            "celery_deadlines_plan_resumes",
            "Stored plans resumed, by verdict and action.",
            ["verdict", "action"],
            registry=registry,
        ),
        queue_wait=Histogram(
            "celery_deadlines_queue_wait_seconds",
            "From claimable (published, or a retry's countdown over) to claimed.",
            ["task"],
            buckets=QUEUE_WAIT_BUCKETS,
            registry=registry,
        ),
        runs_held=Counter(
            "celery_deadlines_runs_held",
            "Runs held as CLOCK_UNCERTAIN.",
            ["task"],
            registry=registry,
        ),
        cancels=Counter(
            "celery_deadlines_cancels",
            "Runs cancelled with everything they started, in this process.",
            registry=registry,
        ),
        runs_cancelled=Counter(
            "celery_deadlines_runs_cancelled",
            "Unended runs the cancels made in this process changed.",
            registry=registry,
        ),
        clock=ClockGauges(),
    )
    registry.register(made.clock)
    _connect(made, id(registry))
    _installed[registry] = made
    return made


def _connect(m: Metrics, key: int) -> None:
    def refused(sender: object, task_name: str, decision: Any, **_: Any) -> None:
        task = task_label(sender, task_name)
        m.refusals.labels(task, str(decision.gate), str(decision.reason)).inc()

    def expired(sender: object, task_name: str, reason: str, **_: Any) -> None:
        m.expired.labels(task_label(sender, task_name), reason).inc()

    def dispatch(reason: str, **_: Any) -> None:
        m.dispatch_refusals.labels(reason).inc()

    def write(write: str, **_: Any) -> None:
        m.fenced_writes_rejected.labels(write).inc()

    def resumed(verdict: Any, action: str, **_: Any) -> None:
        m.plan_resumes.labels(verdict.kind, action).inc()

    def claimed(sender: object, task_name: str, queue_wait: timedelta, **_: Any) -> None:
        m.queue_wait.labels(task_label(sender, task_name)).observe(queue_wait.total_seconds())

    def held(sender: object, task_name: str, **_: Any) -> None:
        m.runs_held.labels(task_label(sender, task_name)).inc()

    def measured(reading: ClockReading | None, **_: Any) -> None:
        m.clock.record(reading)

    def cancelled(runs: int, **_: Any) -> None:
        m.cancels.inc()
        m.runs_cancelled.inc(runs)

    for signal, receiver in (
        (signals.deadline_refused, refused),
        (signals.run_expired, expired),
        (signals.dispatch_refused, dispatch),
        (signals.write_refused, write),
        (signals.plan_resumed, resumed),
        (signals.run_claimed, claimed),
        (signals.run_held, held),
        (signals.clock_measured, measured),
        (signals.run_cancelled, cancelled),
    ):
        signal.connect(
            receiver, weak=False, dispatch_uid=f"celery_deadlines.contrib.prometheus.{key}"
        )


def serve(port: int, addr: str = "127.0.0.1") -> None:
    """Expose the metrics over HTTP from a thread of this process (installing them
    first). With ``PROMETHEUS_MULTIPROC_DIR`` set, the exposition is prometheus_client's
    multiprocess collector's (every process's counts) plus this process's clock gauges,
    and each scrape first marks dead the processes that exited. Raises
    :class:`ConfigurationError` without prometheus_client."""
    _require()
    from prometheus_client import start_http_server

    made = install()
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        registry = CollectorRegistry()
        registry.register(LiveProcesses(path))
        registry.register(made.clock)
        start_http_server(port, addr, registry=registry)
    else:
        start_http_server(port, addr)


class LiveProcesses:
    """prometheus_client's multiprocess collector, without the live gauges of processes
    that exited (:func:`mark_dead_processes` before each collection)."""

    def __init__(self, path: str) -> None:
        from prometheus_client import multiprocess

        self.path = path
        self._files = multiprocess.MultiProcessCollector(None, path)  # type: ignore[no-untyped-call]

    def collect(self) -> Iterable[Metric]:
        mark_dead_processes(self.path)
        collected: Iterable[Metric] = self._files.collect()  # type: ignore[no-untyped-call]
        return collected


def mark_dead_processes(path: str) -> list[int]:
    """Call prometheus_client's ``mark_process_dead`` for every process that has
    live-gauge files in ``path`` and is no longer running; return their pids.

    prometheus_client wants it called by the parent once a child exited (gunicorn's
    ``child_exit``). Celery sends nothing in the main process when a pool process exits
    (``worker_process_shutdown`` runs in the child, and never for one killed by a hard
    time limit), so the worker's exporter asks the system at each scrape instead.
    """
    from prometheus_client import multiprocess

    pids = set()
    for name in glob.glob(os.path.join(glob.escape(path), "gauge_live*_*.db")):
        owner = os.path.basename(name).removesuffix(".db").rpartition("_")[2]
        if owner.isdigit():
            pids.add(int(owner))
    dead = sorted(pid for pid in pids if not _running(pid))
    for pid in dead:
        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
    return dead


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and, where ``/proc`` tells, is no zombie (a pool
    process that exited stays one until the pool's next maintenance reaps it)."""
    try:
        os.kill(pid, 0)  # signal 0: nothing is sent, the process is only looked up
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()  # after "(command name)"
    except FileNotFoundError:  # no /proc here, or the process went since
        return not os.path.isdir("/proc/self")
    except OSError:
        return True
    return fields[:1] != [b"Z"]


# -- the worker's exporter (deadlines_metrics_port) ------------------------------------


def connect() -> None:
    """Connect the worker signals (idempotent; called by :func:`celery_deadlines.install`)."""
    for signal, receiver, uid in (
        (worker_init, _install_in_main_process, "install"),
        (worker_process_init, _install_in_pool_process, "install_in_pool"),
        (worker_ready, _serve, "serve"),
    ):
        signal.connect(
            receiver, dispatch_uid=f"celery_deadlines.contrib.prometheus.{uid}", weak=False
        )


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
    except ConfigurationError:
        return
    if INSTALLED:
        install()


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
    if not INSTALLED:
        logger.error(
            "metrics not served: %s is %s but prometheus_client is not installed; %s",
            conf.METRICS_PORT.describe(),
            port,
            EXTRA,
        )
        return
    try:
        serve(port, address)
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
