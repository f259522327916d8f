"""The deadline starts where the work starts: at the incoming request.

:func:`ingress_scope` opens a :func:`~celery_deadlines.deadline_scope` for the handling of
one request, from the request's budget, shortened by a deadline a trusted upstream sent in
a header (the rules: :mod:`celery_deadlines.rules.incoming`). Every task published inside it
inherits that deadline, as a child inherits its parent's. It is plain Python for any
framework; Django's middleware (:mod:`celery_deadlines.middleware`) uses the same two
steps, :func:`decide` and :func:`scope_for`.

A header that was not used is logged on the ``celery_deadlines`` logger with its reason:
at WARNING when a trusted peer sent a malformed or absurd value (a proxy to fix), at INFO
otherwise (an untrusted peer, a value that would extend the budget). An untrusted peer's
value is never parsed. Nothing here fails the request because of a header.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from celery import current_app

from ..clock import get_clock
from ..conf import REQUEST_BUDGET, REQUEST_HEADERS, TRUSTED_PROXIES, Settings, settings_for
from ..rules import incoming
from ..rules.budgets import UNSET, DurationLike, Unset, parse_budget
from ..rules.incoming import Decision
from . import telemetry
from .propagation import deadline_scope

logger = logging.getLogger("celery_deadlines")

__all__ = ["Decision", "decide", "ingress_scope", "scope_for"]


def decide(
    headers: Mapping[str, str],
    *,
    budget: timedelta | None,
    budget_source: str,
    settings: Settings,
    peer: str | None = None,
    trusted: bool | None = None,
) -> Decision:
    """The request's deadline, now, with every unused header logged. ``trusted``
    (when given) overrides the check of ``peer`` against ``deadlines_trusted_proxies``."""
    honoured = settings.get(REQUEST_HEADERS)
    if trusted is None:
        networks = settings.get(TRUSTED_PROXIES)
        trusted = incoming.is_trusted(peer, networks)
    lowered = {name.lower(): value for name, value in headers.items()} if honoured else {}
    decision = incoming.decide(
        now=get_clock().now(),
        budget=budget,
        budget_source=budget_source,
        headers=lowered,
        honoured=honoured,
        trusted=trusted,
        horizon=settings.max_budget,
    )
    for ignored in decision.ignored:
        level = logging.INFO if ignored.why in ("untrusted", "later") else logging.WARNING
        logger.log(
            level,
            "request header %s=%s from %s ignored (%s): %s",
            ignored.header,
            ignored.shown,
            peer or "an unknown peer",
            ignored.why,
            ignored.detail,
        )
    return decision


@contextmanager
def scope_for(decision: Decision, *, app: Any = None) -> Iterator[Decision]:
    """Open the deadline scope ``decision`` names (none without a deadline) and report
    it to tracing. An enclosing scope or a running task can only shorten it: the
    decision yielded is the one in force."""
    if decision.deadline is None:
        yield decision
        return
    with deadline_scope(deadline=decision.deadline, app=app) as scope:
        if scope.deadline != decision.deadline:
            decision = dataclasses.replace(
                decision, deadline=scope.deadline, source=f"enclosing {scope.source}"
            )
        assert decision.deadline is not None
        assert decision.source is not None
        telemetry.annotate_ingress(
            deadline=decision.deadline,
            source=decision.source,
            remaining=decision.deadline - get_clock().now(),
        )
        yield decision


@contextmanager
def ingress_scope(
    headers: Mapping[str, str],
    *,
    budget: DurationLike | Unset | None = UNSET,
    peer: str | None = None,
    trusted: bool | None = None,
    app: Any = None,
) -> Iterator[Decision]:
    """Handle one incoming request under its deadline: everything published inside the
    block inherits it.

    ``headers`` are the request's (any case); ``budget`` the request's own (``UNSET``:
    the setting ``deadlines_request_budget``; ``None``: no deadline, and no header makes
    one); ``peer`` the address the request came from, checked against
    ``deadlines_trusted_proxies`` unless ``trusted`` says it. Settings are the Celery
    app's (``app``, or the current one). Yields the :class:`Decision`: its ``deadline``,
    ``source``, the ``ignored`` headers, and ``remaining(now)``. Raises
    :class:`InvalidDeadline` for a bad ``budget``, never for a header.
    """
    settings = settings_for(app or current_app)
    if budget is UNSET:
        span, source = settings.get(REQUEST_BUDGET), "default request budget"
    else:
        span = parse_budget(budget, name="budget", maximum=settings.max_budget)
        source = "budget"
    decision = decide(
        headers, budget=span, budget_source=source, settings=settings, peer=peer, trusted=trusted
    )
    with scope_for(decision, app=app) as in_force:
        yield in_force
