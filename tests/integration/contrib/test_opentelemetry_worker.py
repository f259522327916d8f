"""Deadlines on the spans of a real ``celery worker`` traced with OpenTelemetry.

The worker (``tests.support.tracedapp``: prefork, instrumented with
opentelemetry-instrumentation-celery) writes its finished spans to a file; this process
publishes with the same instrumentation on the SDK's in-memory exporter, so a worker's
span can be checked against the publish span it continues.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from celery_deadlines import DEADLINE_HEADER, DeadlineRefused
from tests.support.otel import current, memory_exporter, read_spans
from tests.support.processes import Transport, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def published(redis_client: Any) -> Iterator[InMemorySpanExporter]:
    """This process's publish spans (Celery instrumented as a traced caller's would be;
    the client app current meanwhile, where the instrumentation looks tasks up)."""
    exporter = memory_exporter()
    exporter.clear()
    instrumentor = CeleryInstrumentor()  # type: ignore[no-untyped-call]
    instrumentor.instrument()
    try:
        with current(redis_client):
            yield exporter
    finally:
        instrumentor.uninstrument()
        exporter.clear()


def publish_span_of(published: InMemorySpanExporter, task_id: str) -> Any:
    [span] = [
        span
        for span in published.get_finished_spans()
        if (span.attributes or {}).get("messaging.message.id") == task_id
    ]
    return span


def worker_span(spans_file: Path, name: str, task_id: str) -> dict[str, Any]:
    """The worker's span ``name`` for ``task_id``, once it is written (after the result)."""

    def found() -> dict[str, Any] | None:
        for span in read_spans(spans_file):
            attributes = span["attributes"]
            if span["name"] == name and task_id in (
                attributes.get("messaging.message.id"),
                attributes.get("celery.task_id"),
            ):
                return span
        return None

    span: dict[str, Any] = wait_for(found, timeout=20)
    return span


def refusal_event(span: dict[str, Any]) -> dict[str, Any]:
    [event] = [event for event in span["events"] if event["name"] == "celery_deadlines.refused"]
    attributes: dict[str, Any] = event["attributes"]
    return attributes


def test_a_traced_worker_puts_the_deadline_on_task_spans_and_refusals_as_events(
    redis: Transport,
    redis_client: Any,
    start_worker: Any,
    tmp_path: Path,
    published: InMemorySpanExporter,
) -> None:
    from tests.support.workerapp import manual_retry, probe

    spans_file = tmp_path / "spans.jsonl"
    start_worker(
        redis, app_module="tests.support.tracedapp", extra_env={"TEST_SPANS_FILE": str(spans_file)}
    )

    # a run: its span carries the deadline, where it came from and the time left at start
    ran = probe.apply_async(("traced",), budget=30)
    seen = ran.get(timeout=20)
    run = worker_span(spans_file, "run/t.probe", ran.id)
    attributes = run["attributes"]
    deadline = datetime.fromisoformat(attributes["celery_deadlines.deadline"])
    assert deadline == datetime.fromtimestamp(seen["deadline"], UTC)
    assert attributes["celery_deadlines.deadline_source"] == "call"
    assert seen["remaining"] <= attributes["celery_deadlines.remaining_s"] <= 30
    publish = publish_span_of(published, ran.id)
    assert run["trace_id"] == f"{publish.context.trace_id:032x}"  # the caller's trace

    # the retry gate refuses in the pool process: an event on the task's span
    retried = manual_retry.apply_async((30,), budget=5)
    with pytest.raises(DeadlineRefused):
        retried.get(timeout=20)
    event = refusal_event(worker_span(spans_file, "run/t.manual_retry", retried.id))
    assert (event["celery_deadlines.gate"], event["celery_deadlines.reason"]) == (
        "retry",
        "retry_budget_exhausted",
    )

    # the claim gate refuses in the main process, before any task span: a span of its
    # own, continuing the publisher's trace
    bad = redis_client.send_task("t.probe", ("bad",), headers={DEADLINE_HEADER: "garbage"})
    with pytest.raises(DeadlineRefused):
        bad.get(timeout=20)
    refused = worker_span(spans_file, "refused/t.probe", bad.id)
    publish = publish_span_of(published, bad.id)
    assert refused["trace_id"] == f"{publish.context.trace_id:032x}"
    assert refused["parent_id"] == f"{publish.context.span_id:016x}"
    assert refused["kind"] == "CONSUMER"
    event = refusal_event(refused)
    assert (event["celery_deadlines.gate"], event["celery_deadlines.reason"]) == (
        "claim",
        "invalid_deadline",
    )
    assert not [span for span in read_spans(spans_file) if span["name"] == "run/t.probe"][1:]
