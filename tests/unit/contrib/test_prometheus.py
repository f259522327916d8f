"""The Prometheus extra: each metric is fed by its signal, in its own registry."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from celery import Celery
from prometheus_client import CollectorRegistry, generate_latest

from celery_deadlines import signals
from celery_deadlines.contrib import prometheus as metrics
from celery_deadlines.core import refusals
from celery_deadlines.rules import gates
from celery_deadlines.rules.plans import Plan, Verdict
from celery_deadlines.rules.skew import ClockReading
from tests.support.processes import wait_for

NOW = datetime(2026, 8, 19, 8, 0, tzinfo=UTC)
#: the app whose tasks the signals below are about; their names are this module's own:
#: an app takes every shared task when it finalizes (the first label lookup here), and
#: another module's shared ``shop.charge`` beside this one is Celery 5.7's
#: DuplicateTaskNameWarning, an error in this suite
APP = Celery("metrics", set_as_current=False)


@APP.task(name="metrics.charge", shared=False)
def charge() -> None: ...


@APP.task(name="metrics.digest", shared=False)
def digest() -> None: ...


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
        refusals.report_refusal(charge, "t-1", "metrics.charge", decision)
    labels = {"task": "metrics.charge", "gate": "claim", "reason": "deadline_passed"}
    assert value(registry, "celery_deadlines_refusals_total", **labels) == 2


def test_expiries_found_by_the_ledger_are_counted_by_reason(registry: CollectorRegistry) -> None:
    signals.run_expired.send(sender=APP, task_id="t", task_name="metrics.digest",
                             reason="missed_occurrence", detail="window closed")  # fmt: skip
    labels = {"task": "metrics.digest", "reason": "missed_occurrence"}
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
    signals.run_claimed.send(sender=charge, task_id="t", task_name="metrics.charge",
                             queue_wait=timedelta(seconds=3))  # fmt: skip
    name = "celery_deadlines_queue_wait_seconds"
    assert value(registry, f"{name}_sum", task="metrics.charge") == 3
    assert value(registry, f"{name}_bucket", task="metrics.charge", le="1.0") == 0
    assert value(registry, f"{name}_bucket", task="metrics.charge", le="5.0") == 1
    signals.run_held.send(sender=charge, task_id="t", task_name="metrics.charge", reading=None,
                          budget=timedelta(seconds=0.5))  # fmt: skip
    assert value(registry, "celery_deadlines_runs_held_total", task="metrics.charge") == 1


def test_a_task_label_is_a_registered_tasks_name_whatever_the_message_calls_it(
    registry: CollectorRegistry,
) -> None:
    decision = gates.admit(gates.Gate.CLAIM, NOW, NOW + timedelta(seconds=1), timedelta(0))
    for n in range(50):  # a worker's claim gate: Celery's request names it by its shadow
        refusals.report_refusal(charge, f"t-{n}", f"shadow-{n}", decision)
        signals.run_expired.send(sender=APP, task_id=f"t-{n}", task_name=f"unknown-{n}",
                                 reason="deadline_passed", detail="")  # fmt: skip
        signals.run_claimed.send(sender=APP, task_id=f"t-{n}", task_name=f"unknown-{n}",
                                 queue_wait=timedelta(seconds=1))  # fmt: skip
        signals.run_held.send(sender=None, task_id="t", task_name=f"unknown-{n}", reading=None,
                              budget=timedelta(seconds=0.5))  # fmt: skip
    outbound = gates.admit(gates.Gate.OUTBOUND, NOW, NOW + timedelta(seconds=1), timedelta(0))
    for n in range(500):  # calls to hosts a caller chose, refused outside any task
        refusals.report_refusal(f"GET host-{n}.example", None, f"GET host-{n}.example", outbound)
    tasks = {
        sample.labels["task"]
        for family in registry.collect()
        for sample in family.samples
        if "task" in sample.labels
    }
    assert tasks == {"metrics.charge", metrics.OTHER_TASK}
    charged = {"task": "metrics.charge", "gate": "claim", "reason": "deadline_passed"}
    assert value(registry, "celery_deadlines_refusals_total", **charged) == 50
    other = {"task": metrics.OTHER_TASK, "gate": "outbound", "reason": "deadline_passed"}
    assert value(registry, "celery_deadlines_refusals_total", **other) == 500
    assert value(registry, "celery_deadlines_runs_held_total", task=metrics.OTHER_TASK) == 50


def test_clock_gauges_are_absent_until_the_clock_is_measured(registry: CollectorRegistry) -> None:
    exposition = generate_latest(registry).decode()
    assert "celery_deadlines_clock" not in exposition  # no 0 that reads as a measurement
    signals.clock_measured.send(sender=None, reading=None)  # a check that could not read it
    assert value(registry, "celery_deadlines_clock_readable") == 0
    assert value(registry, "celery_deadlines_clock_offset_seconds") is None
    assert value(registry, "celery_deadlines_clock_uncertainty_seconds") is None
    reading = ClockReading(timedelta(seconds=-0.25), timedelta(seconds=0.01))
    signals.clock_measured.send(sender=None, reading=reading)
    assert value(registry, "celery_deadlines_clock_readable") == 1
    assert value(registry, "celery_deadlines_clock_offset_seconds") == -0.25
    assert value(registry, "celery_deadlines_clock_uncertainty_seconds") == 0.01


def test_the_clock_gauges_follow_each_reading_and_drop_the_offset_when_it_is_not_read(
    registry: CollectorRegistry,
) -> None:
    reading = ClockReading(timedelta(seconds=-0.25), timedelta(seconds=0.01))
    signals.clock_measured.send(sender=None, reading=reading)
    signals.clock_measured.send(sender=None, reading=None)
    assert value(registry, "celery_deadlines_clock_readable") == 0
    assert value(registry, "celery_deadlines_clock_offset_seconds") is None  # not measured now
    # a local clock that stepped back while measuring: read, but it proves nothing
    signals.clock_measured.send(sender=None, reading=ClockReading(timedelta(0), timedelta.max))
    assert value(registry, "celery_deadlines_clock_readable") == 1
    assert value(registry, "celery_deadlines_clock_offset_seconds") is None


def test_installing_twice_in_one_registry_counts_once(registry: CollectorRegistry) -> None:
    metrics.install(registry)
    signals.write_refused.send(sender=None, task_id="t-1", write="renew")
    assert value(registry, "celery_deadlines_fenced_writes_rejected_total", write="renew") == 1


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="zombies are seen in /proc")
def test_the_live_gauges_of_processes_that_exited_are_marked_dead(tmp_path: Path) -> None:
    reaped = subprocess.Popen([sys.executable, "-c", "pass"])
    reaped.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exited, not yet reaped
    try:
        wait_for(lambda: zombie_state(zombie.pid), timeout=10)
        alive = os.getpid()
        files = [f"gauge_liveall_{alive}.db", f"counter_{reaped.pid}.db"]
        for pid in (reaped.pid, zombie.pid):
            files += [f"gauge_liveall_{pid}.db", f"gauge_livesum_{pid}.db", f"gauge_all_{pid}.db"]
        for name in files:
            (tmp_path / name).touch()
        assert metrics.mark_dead_processes(str(tmp_path)) == sorted([reaped.pid, zombie.pid])
    finally:
        zombie.wait()
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [
            f"gauge_liveall_{alive}.db",  # this process runs
            f"counter_{reaped.pid}.db",  # what an exited process counted still counts
            f"gauge_all_{reaped.pid}.db",  # gauges kept after their process, by their mode
            f"gauge_all_{zombie.pid}.db",
        ]
    )


def zombie_state(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return stat.read().rpartition(b")")[2].split()[0] == b"Z"
