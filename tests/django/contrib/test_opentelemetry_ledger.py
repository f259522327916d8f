"""Deadlines on OpenTelemetry spans in the ledger tier (SQLite and PostgreSQL): the run
span carries the claim's fencing token, and the dispatch guard's refusal is an event.

A run is executed by Celery's own tracer with opentelemetry-instrumentation-celery making
its span; the dispatch guard is driven through ``EffectScope`` as a task body drives it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from celery_deadlines import DeadlineTask
from celery_deadlines.contrib.opentelemetry import LEASE_TOKEN, REFUSED, REMAINING
from celery_deadlines.errors import DispatchRefused
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.models import Run
from tests.django.core.test_effects import attempt, charge, lapse, record
from tests.support.memory_queue import drain
from tests.support.otel import current, instrumented
from tests.support.trace import execute_next

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgres"])

QUEUE = "traced-ledger"
_apps: dict[str, Celery] = {}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with instrumented() as exporter:
        yield exporter


def app_for(alias: str) -> Celery:
    if alias not in _apps:
        app = _apps[alias] = Celery(
            f"traced-{alias}", broker="memory://", backend="cache+memory://", set_as_current=False
        )
        app.conf.update(task_default_queue=QUEUE, deadlines_ledger=True, deadlines_database=alias)
        app.task(base=DeadlineTask, bind=True, name="traced.leased", budget=600)(leased)
    return _apps[alias]


def leased(self: DeadlineTask) -> int:
    return self.lease.token if self.lease else -1


def test_a_ledger_run_span_carries_the_claims_fencing_token(
    alias: str, spans: InMemorySpanExporter
) -> None:
    app = app_for(alias)
    drain(app, QUEUE)
    with current(app):
        app.tasks["traced.leased"].apply_async(task_id="traced-1")
        state, token = execute_next(app, QUEUE)
    assert (state, token) == ("SUCCESS", 1)
    [run] = [span for span in spans.get_finished_spans() if span.name == "run/traced.leased"]
    attributes = run.attributes or {}
    assert (
        attributes[LEASE_TOKEN]
        == token
        == Run.objects.using(alias).get(task_id="traced-1").lease_token
    )
    assert 0 < float(str(attributes[REMAINING])) <= 600


def test_a_dispatch_guard_refusal_is_an_event_on_the_task_span(
    alias: str, spans: InMemorySpanExporter
) -> None:
    store = Store(alias)
    record(store)
    stale = attempt(store, "w1:1")
    lapse(store)
    attempt(store, "w2:2")  # took the run over: the first attempt's lease is stale
    tracer = trace.get_tracer("test")
    with (
        tracer.start_as_current_span("run/shop.charge"),
        pytest.raises(DispatchRefused),
        charge(stale),
    ):
        pytest.fail("the call must not be made")
    [span] = spans.get_finished_spans()
    [event] = [event for event in span.events if event.name == REFUSED]
    attributes = event.attributes or {}
    assert attributes["celery_deadlines.gate"] == "dispatch"
    assert attributes["celery_deadlines.reason"] == "stale_lease"
    assert attributes["celery_deadlines.effect_key"] == "order-42:charge:v1"
    assert attributes["celery_deadlines.task_id"] == "charge-1"
