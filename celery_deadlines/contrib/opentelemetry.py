"""Deadlines on OpenTelemetry spans (the ``otel`` extra); without it, every call does nothing.

``pip install 'celery-deadlines[otel]'`` and trace the worker the usual way
(``opentelemetry-instrumentation-celery``): each task's span then carries the attributes
below, set in ``before_start`` (the instrumentation's ``task_prerun`` has made the task's
span current by then), and every gate's refusal is an event on the current span.

=====================================  =====================================================
``celery_deadlines.deadline``          the execution deadline, ISO 8601 UTC
``celery_deadlines.deadline_source``   where it came from (a task: the message's
                                       ``x_deadline_source``; a request: the ingress's)
``celery_deadlines.remaining_s``       seconds left when the attempt (or request) started
``celery_deadlines.lease_token``       the ledger claim's fencing token (ledger tier only)
=====================================  =====================================================

A refusal is the event ``celery_deadlines.refused`` with ``celery_deadlines.gate``,
``.reason``, ``.detail``, ``.task_name``, ``.task_id`` and, when known,
``.deadline`` and ``.remaining_s``; a dispatch refusal adds ``.effect_key``. It goes on
the span current where the gate refused: the caller's (enqueue), the task's (attempt,
claim in the ledger, retry, dispatch). The claim gate in the worker's main process runs
before any task span exists: it records a short span of its own, ``refused/<task name>``
(kind CONSUMER), a child of the publisher's span when the message carries its context.

:func:`celery_deadlines.install` wires these functions into the Celery tier
(:mod:`celery_deadlines.core.telemetry`), which calls them and imports nothing of this
module. Their contract: they never raise and never import OpenTelemetry. They look for
``opentelemetry.trace`` in ``sys.modules``: a span can be current only if something (the
instrumentation, the SDK, the application) imported it, so when it is absent there is
nothing to annotate, and the check is one dict lookup.
With OpenTelemetry loaded but no span recording (no tracer provider set), each call
reads the current span and stops there.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from ..rules import wire
from ..rules.gates import Decision
from ..rules.stamping import SOURCES

if TYPE_CHECKING:
    from opentelemetry.trace import Span

logger = logging.getLogger("celery_deadlines")

#: The module whose presence means a span may be current (see the module docstring).
API: Final = "opentelemetry.trace"

PREFIX: Final = "celery_deadlines."
#: the span attribute of the deadline in force (an RFC 3339 instant, UTC)
DEADLINE: Final = PREFIX + "deadline"
#: the span attribute saying where that deadline came from (``call``, ``parent``, ...)
DEADLINE_SOURCE: Final = PREFIX + "deadline_source"
#: the span attribute of the seconds left when the attempt started
REMAINING: Final = PREFIX + "remaining_s"
#: the span attribute of the attempt's fencing token (with the run ledger)
LEASE_TOKEN: Final = PREFIX + "lease_token"
#: the event a refusal at any gate is recorded as, and its attributes
REFUSED: Final = PREFIX + "refused"
GATE: Final = PREFIX + "gate"
REASON: Final = PREFIX + "reason"
DETAIL: Final = PREFIX + "detail"
TASK_NAME: Final = PREFIX + "task_name"
TASK_ID: Final = PREFIX + "task_id"
EFFECT_KEY: Final = PREFIX + "effect_key"


def observed() -> bool:
    """Whether a span may be current: OpenTelemetry's API is loaded (one lookup)."""
    return API in sys.modules


def annotate_ingress(*, deadline: datetime, source: str, remaining: timedelta) -> None:
    """Set the request's deadline, its source and the time left on the current span."""
    if API not in sys.modules:  # every request: one lookup when nobody traces
        return
    span = _recording_span()
    if span is not None:
        _annotate(span, deadline, source, remaining, None)


def annotate_attempt(
    *,
    deadline: datetime | None,
    now: datetime,
    headers: Mapping[str, Any],
    lease_token: int | None,
) -> None:
    """Set an attempt's deadline, its source (``headers``: the message's), the time left
    at its start (``now``) and its lease token on the current span: the task's, which the
    Celery instrumentation made current in ``task_prerun``."""
    if API not in sys.modules:  # the attempt's path: one lookup when nobody traces
        return
    span = _recording_span()
    if span is None:
        return
    source: object = None
    remaining = None
    if deadline is not None:
        try:
            source = headers.get(wire.SOURCE_HEADER)
            remaining = deadline - now
        except Exception:  # tracing must never change a decision
            logger.debug("reading the attempt's deadline for its span failed", exc_info=True)
    _annotate(
        span,
        deadline,
        source if isinstance(source, str) and source in SOURCES else None,
        remaining,
        lease_token,
    )


def record_refusal(
    decision: Decision,
    *,
    task_name: str,
    task_id: str | None,
    carrier: Mapping[str, Any] | None = None,
) -> None:
    """A gate's refusal, as the event ``celery_deadlines.refused`` on the current span.

    ``carrier`` (the message's headers) is given by the claim gate in the worker's main
    process: with no span current there, the refusal gets a short span of its own,
    parented by the context the publisher injected into the message, if any.
    """
    if API not in sys.modules:
        return
    try:
        attributes: dict[str, Any] = {
            GATE: str(decision.gate.value),
            REASON: str(decision.reason.value) if decision.reason else "",
            DETAIL: decision.detail,
            TASK_NAME: task_name,
        }
        if task_id:
            attributes[TASK_ID] = task_id
        if decision.deadline is not None:
            attributes[DEADLINE] = _iso(decision.deadline)
        if decision.remaining is not None:
            attributes[REMAINING] = decision.remaining.total_seconds()
        span = _recording_span()
        if span is not None:
            span.add_event(REFUSED, attributes)
        elif carrier is not None:
            _refusal_span(attributes, task_name, task_id, carrier)
    except Exception:  # tracing must never change a decision
        logger.debug("recording a refusal on a span failed", exc_info=True)


def record_dispatch_refusal(*, task_id: str, key: str, reason: str, detail: str) -> None:
    """The dispatch guard's refusal of a side effect, as the same event on the task's span."""
    if API not in sys.modules:
        return
    span = _recording_span()
    if span is None:
        return
    attributes = {GATE: "dispatch", REASON: reason, DETAIL: detail, TASK_ID: task_id}
    try:
        span.add_event(REFUSED, {**attributes, EFFECT_KEY: key})
    except Exception:  # tracing must never change a decision
        logger.debug("recording a refusal on a span failed", exc_info=True)


def _recording_span() -> Span | None:
    """The current span if it records, else ``None`` (never imports OpenTelemetry)."""
    api: Any = sys.modules.get(API)
    if api is None:
        return None
    try:
        span: Span = api.get_current_span()
        return span if span.is_recording() else None
    except Exception:  # a partly imported or broken OpenTelemetry: nothing to annotate
        logger.debug("reading the current span failed", exc_info=True)
        return None


def _annotate(
    span: Span,
    deadline: datetime | None,
    source: str | None,
    remaining: timedelta | None,
    lease_token: int | None,
) -> None:
    try:
        if deadline is not None:
            span.set_attribute(DEADLINE, _iso(deadline))
        if source is not None:
            span.set_attribute(DEADLINE_SOURCE, source)
        if remaining is not None:
            span.set_attribute(REMAINING, remaining.total_seconds())
        if lease_token is not None:
            span.set_attribute(LEASE_TOKEN, lease_token)
    except Exception:  # tracing must never change a decision
        logger.debug("annotating the span failed", exc_info=True)


def _refusal_span(
    attributes: dict[str, Any], task_name: str, task_id: str | None, carrier: Mapping[str, Any]
) -> None:
    """A short span for a refusal made where no span is current (the claim gate)."""
    # OpenTelemetry is loaded (``API`` is in sys.modules): these imports load nothing new
    # but the propagation API, which the instrumentation has loaded too.
    from opentelemetry import propagate, trace

    # no tracer provider is set: a span would record nothing (and a refusal under
    # overload is one of many, each made by the worker's main process)
    no_provider = trace.ProxyTracerProvider | trace.NoOpTracerProvider
    if isinstance(trace.get_tracer_provider(), no_provider):
        return
    parent = propagate.extract(dict(carrier))
    span_attributes = {key: value for key, value in attributes.items() if key != DETAIL}
    source = carrier.get(wire.SOURCE_HEADER)
    if (
        isinstance(source, str) and source in SOURCES
    ):  # a header's word: only a value this package writes is shown
        span_attributes[DEADLINE_SOURCE] = source
    span_attributes["celery.task_name"] = task_name
    if task_id:
        span_attributes["messaging.message.id"] = task_id
    tracer = trace.get_tracer("celery_deadlines")
    with tracer.start_as_current_span(
        f"refused/{task_name}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes=span_attributes,
    ) as span:
        span.add_event(REFUSED, attributes)


def _iso(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat()


__all__ = [
    "DEADLINE",
    "DEADLINE_SOURCE",
    "LEASE_TOKEN",
    "REFUSED",
    "REMAINING",
    "annotate_attempt",
    "annotate_ingress",
    "record_dispatch_refusal",
    "record_refusal",
]
