"""The worker app of the tracing tests: ``tests.support.workerapp`` (its app and tasks)
traced with the OpenTelemetry SDK, finished spans appended to ``TEST_SPANS_FILE``.

As opentelemetry-instrumentation-celery's documentation says for a prefork worker, Celery
is instrumented in each pool process (``worker_process_init``); the tracer provider is
set here, at import, so the worker's main process (the claim gate) has it too, and the
pool processes inherit it. The span processor is synchronous: no exporter thread to
lose across the fork.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery.signals import worker_process_init
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.support.otel import JsonLinesExporter
from tests.support.workerapp import app

__all__ = ["app"]

_provider = TracerProvider()
_provider.add_span_processor(
    SimpleSpanProcessor(JsonLinesExporter(Path(os.environ["TEST_SPANS_FILE"])))
)
trace.set_tracer_provider(_provider)


@worker_process_init.connect(weak=False)
def instrument(**_: Any) -> None:
    CeleryInstrumentor().instrument()  # type: ignore[no-untyped-call]
