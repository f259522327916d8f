"""Deadlines on OpenTelemetry spans, on the SDK's in-memory exporter.

Tasks run through Celery's own tracer (what a pool process runs) with
``opentelemetry-instrumentation-celery`` making the spans, on a fake clock and the memory
broker; tests/integration/contrib/test_opentelemetry_worker.py runs the same across real worker
processes. Without OpenTelemetry loaded the library imports none of it (a subprocess).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from celery_deadlines import DEADLINE_HEADER, SOURCE_HEADER, DeadlineRefused, DeadlineTask
from celery_deadlines.contrib.opentelemetry import (
    DEADLINE,
    DEADLINE_SOURCE,
    LEASE_TOKEN,
    REFUSED,
    REMAINING,
    annotate_ingress,
    record_dispatch_refusal,
)
from celery_deadlines.rules.wire import encode
from celery_deadlines.testing import FakeClock, FakeLedger, use_ledger
from tests.support.memory_queue import drain
from tests.support.otel import current, instrumented
from tests.support.processes import REPO
from tests.support.trace import execute_next
from tests.support.unit_tasks import claim

QUEUE = f"traced-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Finished spans, with Celery instrumented as a traced worker and caller would be."""
    with instrumented() as exporter:
        yield exporter


def own_app() -> Celery:
    """An app on the memory broker, current only while a test runs (``current``)."""
    app = Celery(
        f"traced-{uuid.uuid4().hex[:6]}",
        broker="memory://",
        backend="cache+memory://",
        set_as_current=False,
    )
    app.conf.task_default_queue = QUEUE
    drain(app, QUEUE)
    return app


@pytest.fixture
def traced() -> Iterator[Celery]:
    app = own_app()
    app.conf.deadlines_ledger = False  # the header tier
    with current(app):
        yield app
    app.close()


def span_named(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = [span for span in spans.get_finished_spans() if span.name == name]
    assert len(found) == 1, [span.name for span in spans.get_finished_spans()]
    return found[0]


def refusal_event(span: ReadableSpan) -> dict[str, Any]:
    events = [event for event in span.events if event.name == REFUSED]
    assert len(events) == 1, [event.name for event in span.events]
    return dict(events[0].attributes or {})


def tasks(app: Celery) -> tuple[Any, Any]:
    @app.task(base=DeadlineTask, bind=True, name="traced.work", shared=False)
    def work(self: DeadlineTask) -> float:
        return self.remaining()

    @app.task(base=DeadlineTask, bind=True, name="traced.flaky", attempt_timeout=1, shared=False)
    def flaky(self: DeadlineTask) -> None:
        raise self.retry(countdown=30, exc=RuntimeError("provider down"))

    return work, flaky


def test_a_task_span_carries_the_deadline_its_source_and_the_time_left_at_start(
    traced: Celery, clock: FakeClock, spans: InMemorySpanExporter
) -> None:
    work, _ = tasks(traced)
    deadline = clock.now() + timedelta(seconds=30)
    work.apply_async(budget=30)
    clock.advance(4)  # the time it waited in the queue
    assert execute_next(traced, QUEUE) == ("SUCCESS", 26.0)
    run = span_named(spans, "run/traced.work")
    attributes = dict(run.attributes or {})
    assert datetime.fromisoformat(str(attributes[DEADLINE])) == deadline
    assert str(attributes[DEADLINE]).endswith("+00:00")  # ISO 8601, UTC
    assert attributes[DEADLINE_SOURCE] == "call"
    assert attributes[REMAINING] == 26.0
    assert LEASE_TOKEN not in attributes  # the header tier has no lease
    assert not [event for event in run.events if event.name == REFUSED]
    # the instrumentation's own span tree is untouched: the run is its publish's child
    publish = span_named(spans, "apply_async/traced.work")
    assert run.parent is not None
    assert run.parent.span_id == publish.context.span_id


def test_a_task_without_a_deadline_gets_no_deadline_attributes(
    traced: Celery, clock: FakeClock, spans: InMemorySpanExporter
) -> None:
    work, _ = tasks(traced)
    work.apply_async()
    assert execute_next(traced, QUEUE)[0] == "SUCCESS"
    attributes = span_named(spans, "run/traced.work").attributes or {}
    assert not [name for name in attributes if name.startswith("celery_deadlines.")]


def test_an_attempt_refused_at_its_gate_is_an_event_on_the_task_span(
    traced: Celery, clock: FakeClock, spans: InMemorySpanExporter
) -> None:
    work, _ = tasks(traced)
    work.apply_async(budget=10, task_id="late-1")
    clock.advance(11)
    assert execute_next(traced, QUEUE)[0] == "IGNORED"
    run = span_named(spans, "run/traced.work")
    assert run.status.status_code is trace.StatusCode.UNSET  # as docs/howto/tracing.md says
    event = refusal_event(run)
    assert (event["celery_deadlines.gate"], event["celery_deadlines.reason"]) == (
        "attempt",
        "deadline_passed",
    )
    assert event["celery_deadlines.task_id"] == "late-1"
    assert event["celery_deadlines.task_name"] == "traced.work"
    assert datetime.fromisoformat(str(event[DEADLINE])) == clock.now() - timedelta(seconds=1)
    assert event[REMAINING] == -1.0


def test_a_refused_retry_is_an_event_on_the_task_span_with_the_last_error(
    traced: Celery, clock: FakeClock, spans: InMemorySpanExporter
) -> None:
    _, flaky = tasks(traced)
    flaky.apply_async(budget=5)
    state, raised = execute_next(traced, QUEUE)
    assert state == "FAILURE"
    assert isinstance(raised, DeadlineRefused)
    run = span_named(spans, "run/traced.flaky")
    event = refusal_event(run)
    assert (event["celery_deadlines.gate"], event["celery_deadlines.reason"]) == (
        "retry",
        "retry_budget_exhausted",
    )
    assert "provider down" in str(event["celery_deadlines.detail"])


def test_an_enqueue_refusal_is_an_event_on_the_callers_span(
    traced: Celery, clock: FakeClock, spans: InMemorySpanExporter
) -> None:
    work, _ = tasks(traced)
    with (
        trace.get_tracer("test").start_as_current_span("caller"),
        pytest.raises(DeadlineRefused),
    ):
        work.apply_async(deadline=clock.now() - timedelta(seconds=1))
    event = refusal_event(span_named(spans, "caller"))
    assert (event["celery_deadlines.gate"], event["celery_deadlines.reason"]) == (
        "enqueue",
        "deadline_passed",
    )
    assert event["celery_deadlines.task_name"] == "traced.work"
    assert "celery_deadlines.task_id" not in event  # nothing was published


def test_the_claim_gate_records_a_span_of_its_own_under_the_publishers_context(
    traced: Celery, clock: FakeClock, spans: InMemorySpanExporter
) -> None:
    work, _ = tasks(traced)
    carrier: dict[str, str] = {}
    with trace.get_tracer("test").start_as_current_span("publisher") as publisher:
        propagate.inject(carrier)
    expired = {DEADLINE_HEADER: encode(clock.now() - timedelta(seconds=1)), SOURCE_HEADER: "call"}
    request, _ = claim(traced, work, {**expired, **carrier})
    assert request.revoked() is True  # in the worker's main process: no span is current
    refused = span_named(spans, "refused/traced.work")
    assert refused.kind is trace.SpanKind.CONSUMER
    assert refused.parent is not None
    assert refused.parent.span_id == publisher.get_span_context().span_id
    assert refused.context.trace_id == publisher.get_span_context().trace_id
    attributes = dict(refused.attributes or {})
    assert attributes[DEADLINE_SOURCE] == "call"
    assert attributes["messaging.message.id"] == "m-1"
    event = refusal_event(refused)
    assert (event["celery_deadlines.gate"], event["celery_deadlines.reason"]) == (
        "claim",
        "deadline_passed",
    )


def test_a_claim_gate_refusal_without_a_trace_context_starts_a_new_trace(
    traced: Celery, clock: FakeClock, spans: InMemorySpanExporter
) -> None:
    work, _ = tasks(traced)
    request, _ = claim(traced, work, {DEADLINE_HEADER: "garbage"})
    assert request.revoked() is True
    refused = span_named(spans, "refused/traced.work")
    assert refused.parent is None
    assert refusal_event(refused)["celery_deadlines.reason"] == "invalid_deadline"


def test_with_no_tracer_provider_set_the_claim_gate_builds_no_span(
    traced: Celery, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenTelemetry's API is loaded (a library imported it) but nothing set a tracer
    provider: a span would record nothing, and the main process makes none."""
    work, _ = tasks(traced)
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    asked: list[str] = []
    monkeypatch.setattr(trace, "get_tracer", lambda name, *_, **__: asked.append(name))
    request, _ = claim(traced, work, {DEADLINE_HEADER: "garbage"})
    assert request.revoked() is True
    assert asked == []


def test_a_ledger_attempt_span_carries_its_lease_token(
    clock: FakeClock, spans: InMemorySpanExporter
) -> None:
    app = own_app()
    with current(app), use_ledger(FakeLedger()) as ledger:
        work, _ = tasks(app)
        work.apply_async(budget=60, task_id="leased-1")
        ledger.runs["leased-1"].token = 6  # five leases before this one
        assert execute_next(app, QUEUE)[0] == "SUCCESS"
    app.close()
    attributes = span_named(spans, "run/traced.work").attributes or {}
    assert attributes[LEASE_TOKEN] == 7
    assert attributes[REMAINING] == 60.0


def test_a_dispatch_refusal_is_an_event_on_the_current_span(spans: InMemorySpanExporter) -> None:
    with trace.get_tracer("test").start_as_current_span("run/shop.pay"):
        record_dispatch_refusal(task_id="r-1", key="order-7", reason="stale_lease", detail="")
    event = refusal_event(span_named(spans, "run/shop.pay"))
    assert event["celery_deadlines.gate"] == "dispatch"
    assert event["celery_deadlines.reason"] == "stale_lease"
    assert event["celery_deadlines.effect_key"] == "order-7"


def test_the_ingress_sets_the_same_attributes_on_the_request_span(
    spans: InMemorySpanExporter,
) -> None:
    deadline = datetime(2030, 1, 1, 12, 0, 30, tzinfo=UTC)
    with trace.get_tracer("test").start_as_current_span("GET /checkout"):
        annotate_ingress(deadline=deadline, source="header", remaining=timedelta(seconds=2.5))
    attributes = span_named(spans, "GET /checkout").attributes or {}
    assert attributes[DEADLINE] == "2030-01-01T12:00:30+00:00"
    assert attributes[DEADLINE_SOURCE] == "header"
    assert attributes[REMAINING] == 2.5


def test_without_a_recording_span_the_hooks_do_nothing(spans: InMemorySpanExporter) -> None:
    # OpenTelemetry is loaded here, but no span is current
    annotate_ingress(deadline=datetime.now(UTC), source="header", remaining=timedelta(1))
    record_dispatch_refusal(task_id="r-1", key="k", reason="stale_lease", detail="")
    assert spans.get_finished_spans() == ()


#: Publishes, runs an attempt, and has every gate in this process refuse: enqueue,
#: claim (the worker's main process), attempt; then asks the ingress hook to annotate.
WITHOUT_OTEL = """
import sys
from datetime import timedelta

class Absent:  # OpenTelemetry, as if it were not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

if sys.argv[1] == "absent":
    sys.meta_path.insert(0, Absent())

from celery import Celery
from celery_deadlines import DEADLINE_HEADER, DeadlineRefused, DeadlineTask
from celery_deadlines.contrib import opentelemetry as tracing
from celery_deadlines.testing import FakeClock, use_clock
from celery_deadlines.rules.wire import encode
from tests.support.trace import execute_next
from tests.support.unit_tasks import claim

with use_clock(FakeClock()) as clock:
    app = Celery("plain", broker="memory://", backend="cache+memory://")
    app.conf.update(task_default_queue="plain", deadlines_ledger=False)

    @app.task(base=DeadlineTask, bind=True, name="plain.work")
    def work(self):
        return self.remaining()

    work.apply_async(budget=30)
    assert execute_next(app, "plain") == ("SUCCESS", 30.0)
    try:
        work.apply_async(deadline=clock.now() - timedelta(seconds=1))
    except DeadlineRefused:
        pass
    request, _ = claim(app, work, {DEADLINE_HEADER: encode(clock.now() - timedelta(seconds=1))})
    assert request.revoked()
    work.apply_async(budget=1)
    clock.advance(2)
    assert execute_next(app, "plain")[0] == "IGNORED"
    tracing.annotate_ingress(deadline=clock.now(), source="header", remaining=timedelta(1))
loaded = sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry")
print("loaded:", loaded)
"""


def test_without_opentelemetry_loaded_the_library_imports_none_of_it() -> None:
    """Absent: the library works as before. Installed but unused by the application: it
    is not imported either (there can be no span to annotate). Both run at once."""
    runs = {
        otel: subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(WITHOUT_OTEL), otel],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for otel in ("absent", "installed")
    }
    for otel, run in runs.items():
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0, f"{otel}: {err}"
        assert out.strip().splitlines()[-1] == "loaded: []", otel
