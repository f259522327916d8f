"""What the Celery tier tells an observability integration: a task's or a request's
deadline on the current span, and every refusal as an event of it.

Each of these is a no-op until :func:`celery_deadlines.install` wires an integration in
(:mod:`celery_deadlines.contrib.opentelemetry`, whose functions have the same
signatures): the Celery tier calls them, and imports no integration. A call site pays
what a call of a module's function costs, as it did when it called the integration.

:func:`observed` is asked by the paths that skip the calls when nothing can be told
(an attempt admitted in epoch seconds): with an integration wired in, whether it may
have something to be told now (OpenTelemetry: whether its API is loaded at all).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _nothing(*args: Any, **kwargs: Any) -> None:
    """Nothing to tell: no integration is wired in."""


def _never() -> bool:
    return False


#: whether an integration may have something to be told now
observed: Callable[[], bool] = _never
#: ``(*, deadline, now, headers, lease_token)``: an attempt started under a deadline
annotate_attempt: Callable[..., None] = _nothing
#: ``(*, deadline, source, remaining)``: a request's deadline scope was entered
annotate_ingress: Callable[..., None] = _nothing
#: ``(decision, *, task_name, task_id, carrier)``: a gate refused
record_refusal: Callable[..., None] = _nothing
#: ``(*, task_id, key, reason, detail)``: the dispatch guard refused an effect
record_dispatch_refusal: Callable[..., None] = _nothing


def wire(integration: Any) -> None:
    """Tell ``integration`` (a module with the functions above) from now on."""
    global observed, annotate_attempt, annotate_ingress, record_refusal
    global record_dispatch_refusal
    observed = integration.observed
    annotate_attempt = integration.annotate_attempt
    annotate_ingress = integration.annotate_ingress
    record_refusal = integration.record_refusal
    record_dispatch_refusal = integration.record_dispatch_refusal
