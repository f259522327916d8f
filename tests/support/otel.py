"""OpenTelemetry for tests: one in-memory SDK per process, and spans read back by name.

The SDK's global tracer provider can be set once per process, so the tests share one,
with an :class:`InMemorySpanExporter` each test clears. ``JsonLinesExporter`` writes
finished spans to a file, one JSON object a line, for the worker processes of the
integration tests (``tests.support.tracedapp``), whose spans the test reads back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from celery import Celery, _state
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_memory: InMemorySpanExporter | None = None


def memory_exporter() -> InMemorySpanExporter:
    """The exporter of this process's global tracer provider (set on first use)."""
    global _memory
    if _memory is None:
        provider = TracerProvider()
        _memory = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_memory))
        trace.set_tracer_provider(provider)
        if trace.get_tracer_provider() is not provider:
            raise RuntimeError("another tracer provider was set in this process")
    return _memory


@contextmanager
def instrumented() -> Iterator[InMemorySpanExporter]:
    """Celery instrumented as a traced worker and caller are, meanwhile; the finished
    spans in the process's in-memory exporter (cleared before and after)."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    exporter = memory_exporter()
    exporter.clear()
    instrumentor = CeleryInstrumentor()  # type: ignore[no-untyped-call]
    instrumentor.instrument()
    try:
        yield exporter
    finally:
        instrumentor.uninstrument()
        exporter.clear()


@contextmanager
def current(app: Celery) -> Iterator[Celery]:
    """``app`` as Celery's current app meanwhile, then the one before it again.

    The instrumentation looks a published task up by name in ``celery.registry`` (the
    current app's tasks), which finalizes the current app: left to whatever app an earlier
    test left current (closed), it would be finalized without the shared tasks imported
    later, and a later test reading one through ``current_app`` would not find it."""
    state: Any = _state  # its thread-local is not in the type stubs
    previous = state._tls.current_app
    app.set_current()
    try:
        yield app
    finally:
        state._tls.current_app = previous


class JsonLinesExporter(SpanExporter):
    """Append each finished span to ``path`` as one JSON line (many processes may share it:
    each line is one ``write`` on a file opened for appending)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a") as out:
            for span in spans:
                out.write(json.dumps(as_dict(span)) + "\n")
        return SpanExportResult.SUCCESS


def as_dict(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}" if context else None,
        "span_id": f"{context.span_id:016x}" if context else None,
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "kind": span.kind.name,
        "attributes": dict(span.attributes or {}),
        "events": [
            {"name": event.name, "attributes": dict(event.attributes or {})}
            for event in span.events
        ],
    }


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
