"""A worker serves its own metrics (``deadlines_metrics_port``): real ``celery worker``
subprocesses, scraped over HTTP as Prometheus would.

Every worker here is prefork in prometheus_client's multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``) and replaces each pool process after one task, so what a
pool process counted must outlive it, and what it reported as live must not.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from celery_deadlines.contrib.prometheus import OTHER_TASK
from celery_deadlines.rules.wire import DEADLINE_HEADER
from tests.integration.conftest import LEDGER_DB, ended
from tests.support import workerapp
from tests.support.processes import Transport, wait_for

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def scrape(port: int) -> str | None:
    """The exposition served on ``port``, or ``None`` while nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text: str = response.read().decode()
            return text
    except (urllib.error.URLError, ConnectionError):
        return None


def samples(text: str, name: str) -> list[Sample]:
    return [
        sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def refusals(port: int) -> list[tuple[dict[str, str], float]]:
    found = samples(scrape(port) or "", "celery_deadlines_refusals_total")
    return [(sample.labels, sample.value) for sample in found]


def task_labels(text: str) -> set[str]:
    """Every ``task`` label of the exposition, whatever the metric."""
    return {
        sample.labels["task"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "task" in sample.labels
    }


def multiprocess_env(tmp_path: Path, port: int) -> dict[str, str]:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    return {"TEST_METRICS_PORT": str(port), "PROMETHEUS_MULTIPROC_DIR": str(directory)}


def test_a_prefork_worker_serves_its_pool_processes_counts_and_drops_exited_ones_gauges(
    redis: Transport, redis_client: Any, start_worker: Any, tmp_path: Path
) -> None:
    port = free_port()
    env = multiprocess_env(tmp_path, port)
    directory = Path(env["PROMETHEUS_MULTIPROC_DIR"])
    # two pool processes: a task need not wait for the pool to replace the one before
    worker = start_worker(
        redis, app_module="tests.support.metricsapp", concurrency=2, extra_env=env
    )
    wait_for(lambda: scrape(port) is not None, timeout=10)  # served once the worker is ready
    assert "celery_deadlines_clock" not in (scrape(port) or "")  # nothing measures the clock

    # the retry gate refuses in a pool process, which then exits (one task per process)
    refused = workerapp.manual_retry.apply_async((30,), budget=5)
    refused.get(timeout=20, propagate=False)
    assert refused.state == "FAILURE"
    labels = {"task": "t.manual_retry", "gate": "retry", "reason": "retry_budget_exhausted"}
    assert refusals(port) == [(labels, 1.0)]

    # a pool process's live gauge is served while it lives, and gone once it exited
    release = tmp_path / "release"
    held = redis_client.send_task("m.hold_gauge", (str(release),))
    # (the gauge is served at 0 from its creation to its first set: waited past)
    live = wait_for(
        lambda: [s for s in samples(scrape(port) or "", "test_pool_process_up") if s.value],
        timeout=20,
    )
    assert [s.value for s in live] == [1.0]
    pid = live[0].labels["pid"]
    assert pid != str(worker.process.pid)  # a pool process's, not the main process's
    assert (directory / f"gauge_liveall_{pid}.db").exists()
    release.touch()
    assert held.get(timeout=20) == int(pid)
    wait_for(lambda: not samples(scrape(port) or "", "test_pool_process_up"), timeout=20)
    assert not (directory / f"gauge_liveall_{pid}.db").exists()
    # what the exited processes counted is still counted
    assert refusals(port) == [(labels, 1.0)]


def test_a_worker_without_prometheus_client_logs_the_extra_to_install_and_still_runs(
    redis: Transport, redis_client: Any, start_worker: Any, tmp_path: Path
) -> None:
    hidden = tmp_path / "hidden" / "prometheus_client"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    port = free_port()
    worker = start_worker(
        redis,
        app_module="tests.support.metricsapp",
        extra_env={"TEST_METRICS_PORT": str(port), "PYTHONPATH": str(hidden.parent)},
    )
    assert workerapp.probe.delay("still runs").get(timeout=20)["label"] == "still runs"
    errors = [line for line in worker.log().splitlines() if "metrics not served" in line]
    assert len(errors) == 1
    assert "ERROR" in errors[0]
    assert "CELERY_DEADLINES_METRICS_PORT" in errors[0]
    assert "pip install 'celery-deadlines[prometheus]'" in errors[0]
    assert scrape(port) is None


@pytest.mark.usefixtures("postgres")
@pytest.mark.django_db(transaction=True, databases=[LEDGER_DB])
def test_a_ledger_worker_serves_its_clock_once_measured_and_only_its_own(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, tmp_path: Path
) -> None:
    port = free_port()
    tasks = ledger_client(redis_broker)
    ledger_worker(
        redis_broker,
        TEST_CLOCK_SKEW_BUDGET="5",
        TEST_MAX_TASKS_PER_CHILD="1",
        **multiprocess_env(tmp_path, port),
    )

    def clock() -> dict[str, list[Sample]] | None:
        text = scrape(port) or ""
        found = {
            name: samples(text, f"celery_deadlines_clock_{name}")
            for name in ("readable", "offset_seconds", "uncertainty_seconds")
        }
        return found if all(found.values()) else None

    measured = wait_for(clock, timeout=20)  # the reconciler measures it as it starts
    assert [s.value for s in measured["readable"]] == [1.0]
    assert abs(measured["offset_seconds"][0].value) < 5
    # pool processes forked after the reading (one task each) report no clock of their own
    for key in ("order-1", "order-2"):
        result = tasks.effect.apply_async((key,), budget=30)
        result.get(timeout=30)
        wait_for(lambda result=result: ended(result.id), timeout=10)
    after = clock()
    assert after is not None
    assert [s.value for s in after["readable"]] == [1.0]  # no 0 of a process of its own
    assert len(after["offset_seconds"]) == len(after["uncertainty_seconds"]) == 1
    # and what they observed is counted: each claim's queue wait, in its pool process
    waits = samples(scrape(port) or "", "celery_deadlines_queue_wait_seconds_count")
    assert [(s.labels, s.value) for s in waits] == [({"task": "l.effect"}, 2.0)]


def test_messages_named_by_their_shadow_add_no_series_beyond_the_registered_tasks(
    redis: Transport, redis_client: Any, start_worker: Any
) -> None:
    port = free_port()
    start_worker(
        redis, app_module="tests.support.metricsapp", extra_env={"TEST_METRICS_PORT": str(port)}
    )
    wait_for(lambda: scrape(port) is not None, timeout=10)
    # 50 messages of a registered task, each naming itself as it likes (Celery's shadow),
    # each refused by the worker's claim gate (its deadline header is unreadable)
    for n in range(50):
        redis_client.send_task(
            "t.probe", ("bad",), headers={DEADLINE_HEADER: "garbage"}, shadow=f"shadow-{n}"
        )
    wait_for(lambda: sum(value for _, value in refusals(port)) >= 50, timeout=30)
    probe = {"task": "t.probe", "gate": "claim", "reason": "invalid_deadline"}
    assert refusals(port) == [(probe, 50.0)]
    assert task_labels(scrape(port) or "") <= set(workerapp.app.tasks) | {OTHER_TASK}


def test_calls_refused_outside_a_task_to_500_hosts_add_one_series(tmp_path: Path) -> None:
    port = free_port()
    done = tmp_path / "done"
    log = (tmp_path / "producer.log").open("wb")  # a WARNING line a refusal
    producer = subprocess.Popen(
        [sys.executable, "-m", "tests.support.metricsproducer", str(port), "500", str(done)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        refused = wait_for(lambda: done.exists() and done.read_text(), timeout=60)
        assert refused == "500"
        text = scrape(port) or ""
    finally:
        producer.kill()
        producer.wait()
        log.close()
    other = {"task": OTHER_TASK, "gate": "outbound", "reason": "deadline_passed"}
    assert [(s.labels, s.value) for s in samples(text, "celery_deadlines_refusals_total")] == [
        (other, 500.0)
    ]
    assert task_labels(text) == {OTHER_TASK}
