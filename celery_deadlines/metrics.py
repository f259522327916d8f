"""Prometheus metrics for what an operator needs to see (optional extra).

``pip install 'celery-deadlines[prometheus]'``, then in the worker (and in the
producer, for enqueue refusals)::

    from celery_deadlines import metrics

    metrics.install()  # once per process; the metrics join the default registry

Every metric is fed by one of the library's signals (:mod:`celery_deadlines.signals`),
so nothing here is on the path of a decision: a failing exporter never changes one.

==================================================  ==========================================
``celery_deadlines_refusals_total``                 gate refusals, by ``task``, ``gate``,
                                                    ``reason`` (``deadline_refused``)
``celery_deadlines_runs_expired_total``            runs the ledger expired on its own, by
                                                    ``task``, ``reason`` (``run_expired``)
``celery_deadlines_dispatch_refusals_total``        side effects the dispatch guard refused,
                                                    by ``reason``
``celery_deadlines_fenced_writes_rejected_total``   late writes of stale attempts rejected by
                                                    fencing, by ``write``
``celery_deadlines_plan_resumes_total``             plans resumed, by ``verdict`` (continue,
                                                    revalidate, replan) and ``action``
``celery_deadlines_queue_wait_seconds``             histogram: claimable to claimed, by
                                                    ``task``, on the ledger's clock
``celery_deadlines_runs_held_total``                runs held as CLOCK_UNCERTAIN, by ``task``
``celery_deadlines_clock_offset_seconds``           the ledger's clock minus this worker's
``celery_deadlines_clock_uncertainty_seconds``      half the round trip of that reading
``celery_deadlines_clock_readable``                 1 if the last reading succeeded, else 0
==================================================  ==========================================

docs/howto.md ("Watch it in Prometheus") has the queries. In a prefork worker, pool
processes count in their own memory: set ``PROMETHEUS_MULTIPROC_DIR`` before the
worker starts and serve :func:`prometheus_client.multiprocess.MultiProcessCollector`
(prometheus_client's multiprocess mode); :func:`serve` does that when it is set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from . import signals
from .errors import ConfigurationError

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ConfigurationError(
        "celery_deadlines.metrics needs prometheus_client: "
        "pip install 'celery-deadlines[prometheus]'"
    ) from exc

#: Queue waits from a millisecond to an hour.
QUEUE_WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600)


@dataclass(frozen=True)
class Metrics:
    refusals: Counter
    expired: Counter
    dispatch_refusals: Counter
    fenced_writes_rejected: Counter
    plan_resumes: Counter
    queue_wait: Histogram
    runs_held: Counter
    clock_offset: Gauge
    clock_uncertainty: Gauge
    clock_readable: Gauge


#: by registry (kept alive here, so its id() in the receivers' dispatch_uid stays unique)
_installed: dict[CollectorRegistry, Metrics] = {}


def install(registry: CollectorRegistry | None = None) -> Metrics:
    """Create the metrics in ``registry`` (default: prometheus_client's) and feed them
    from the library's signals. Idempotent per registry."""
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
        clock_offset=Gauge(
            "celery_deadlines_clock_offset_seconds",
            "The ledger's clock minus this worker's, at the last reading.",
            registry=registry,
            multiprocess_mode="liveall",
        ),
        clock_uncertainty=Gauge(
            "celery_deadlines_clock_uncertainty_seconds",
            "Half the round trip of the last clock reading.",
            registry=registry,
            multiprocess_mode="liveall",
        ),
        clock_readable=Gauge(
            "celery_deadlines_clock_readable",
            "1 if the ledger's clock could be read at the last check, else 0.",
            registry=registry,
            multiprocess_mode="liveall",
        ),
    )
    _connect(made, id(registry))
    _installed[registry] = made
    return made


def _connect(m: Metrics, key: int) -> None:
    def refused(task_name: str, decision: Any, **_: Any) -> None:
        m.refusals.labels(task_name, str(decision.gate), str(decision.reason)).inc()

    def expired(task_name: str, reason: str, **_: Any) -> None:
        m.expired.labels(task_name, reason).inc()

    def dispatch(reason: str, **_: Any) -> None:
        m.dispatch_refusals.labels(reason).inc()

    def write(write: str, **_: Any) -> None:
        m.fenced_writes_rejected.labels(write).inc()

    def resumed(verdict: Any, action: str, **_: Any) -> None:
        m.plan_resumes.labels(verdict.kind, action).inc()

    def claimed(task_name: str, queue_wait: timedelta, **_: Any) -> None:
        m.queue_wait.labels(task_name).observe(queue_wait.total_seconds())

    def held(task_name: str, **_: Any) -> None:
        m.runs_held.labels(task_name).inc()

    def measured(reading: Any, **_: Any) -> None:
        m.clock_readable.set(0 if reading is None else 1)
        if reading is not None and reading.uncertainty != timedelta.max:
            m.clock_offset.set(reading.offset.total_seconds())
            m.clock_uncertainty.set(reading.uncertainty.total_seconds())

    for signal, receiver in (
        (signals.deadline_refused, refused),
        (signals.run_expired, expired),
        (signals.dispatch_refused, dispatch),
        (signals.write_refused, write),
        (signals.plan_resumed, resumed),
        (signals.run_claimed, claimed),
        (signals.run_held, held),
        (signals.clock_measured, measured),
    ):
        signal.connect(receiver, weak=False, dispatch_uid=f"celery_deadlines.metrics.{key}")


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Expose the metrics over HTTP (in multiprocess mode when
    ``PROMETHEUS_MULTIPROC_DIR`` is set, so pool processes' counts are included)."""
    from prometheus_client import start_http_server

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        start_http_server(port, addr, registry=registry)
    else:
        start_http_server(port, addr)
