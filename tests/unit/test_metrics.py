"""The Prometheus extra: each metric is fed by its signal, in its own registry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from celery_deadlines import gates, metrics, signals
from celery_deadlines.plans import Plan, Verdict
from celery_deadlines.skew import ClockReading

NOW = datetime(2026, 8, 19, 8, 0, tzinfo=UTC)


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    metrics.install(registry)
    return registry


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_refusals_are_counted_by_task_gate_and_reason(registry: CollectorRegistry) -> None:
    decision = gates.admit(gates.Gate.CLAIM, NOW, NOW + timedelta(seconds=1), timedelta(0))
    for _ in range(2):
        signals.report_refusal("sender", "t-1", "shop.charge", decision)
    labels = {"task": "shop.charge", "gate": "claim", "reason": "deadline_passed"}
    assert value(registry, "celery_deadlines_refusals_total", **labels) == 2


def test_expiries_found_by_the_ledger_are_counted_by_reason(registry: CollectorRegistry) -> None:
    signals.run_expired.send(sender=None, task_id="t", task_name="shop.digest",
                             reason="missed_occurrence", detail="window closed")  # fmt: skip
    labels = {"task": "shop.digest", "reason": "missed_occurrence"}
    assert value(registry, "celery_deadlines_runs_expired_total", **labels) == 1


def test_fenced_writes_and_dispatch_refusals_are_counted(registry: CollectorRegistry) -> None:
    signals.write_refused.send(sender=None, task_id="t-1", write="checkpoint")
    signals.dispatch_refused.send(sender=None, task_id="t-1", key="k", reason="stale_lease")
    assert value(registry, "celery_deadlines_fenced_writes_rejected_total", write="checkpoint") == 1
    assert value(registry, "celery_deadlines_dispatch_refusals_total", reason="stale_lease") == 1


def test_plan_resumes_are_counted_by_verdict_and_action(registry: CollectorRegistry) -> None:
    plan = Plan((), (), NOW, NOW + timedelta(minutes=5))
    verdict = Verdict("revalidate", "plan_expired", plan)
    signals.plan_resumed.send(sender=None, task_id="t", task_name="n", verdict=verdict,
                              action="pause")  # fmt: skip
    labels = {"verdict": "revalidate", "action": "pause"}
    assert value(registry, "celery_deadlines_plan_resumes_total", **labels) == 1


def test_queue_wait_and_holds_are_recorded_per_task(registry: CollectorRegistry) -> None:
    signals.run_claimed.send(sender=None, task_id="t", task_name="shop.charge",
                             queue_wait=timedelta(seconds=3))  # fmt: skip
    name = "celery_deadlines_queue_wait_seconds"
    assert value(registry, f"{name}_sum", task="shop.charge") == 3
    assert value(registry, f"{name}_bucket", task="shop.charge", le="1.0") == 0
    assert value(registry, f"{name}_bucket", task="shop.charge", le="5.0") == 1
    signals.run_held.send(sender=None, task_id="t", task_name="shop.charge", reading=None,
                          budget=timedelta(seconds=0.5))  # fmt: skip
    assert value(registry, "celery_deadlines_runs_held_total", task="shop.charge") == 1


def test_the_clock_gauges_follow_each_reading(registry: CollectorRegistry) -> None:
    reading = ClockReading(timedelta(seconds=-0.25), timedelta(seconds=0.01))
    signals.clock_measured.send(sender=None, reading=reading)
    assert value(registry, "celery_deadlines_clock_offset_seconds") == -0.25
    assert value(registry, "celery_deadlines_clock_uncertainty_seconds") == 0.01
    assert value(registry, "celery_deadlines_clock_readable") == 1
    signals.clock_measured.send(sender=None, reading=None)
    assert value(registry, "celery_deadlines_clock_readable") == 0
    assert value(registry, "celery_deadlines_clock_offset_seconds") == -0.25  # last known


def test_installing_twice_in_one_registry_counts_once(registry: CollectorRegistry) -> None:
    metrics.install(registry)
    signals.write_refused.send(sender=None, task_id="t-1", write="renew")
    assert value(registry, "celery_deadlines_fenced_writes_rejected_total", write="renew") == 1
