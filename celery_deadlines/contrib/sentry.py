"""What Sentry's transaction says of an expected refusal; without sentry-sdk, nothing.

sentry-sdk's Celery integration marks a task's transaction ``internal_error`` when any
exception but Celery's ``Retry``, ``Ignore`` and ``Reject`` leaves the body. That
includes the refusals a :class:`~celery_deadlines.task.DeadlineTask` declares expected
in ``throws`` (a retry the budget cannot hold, a dispatch the guard refused, a plan
that may not resume): Sentry sends no error event for them, but its failure rate and
its performance views count them as the application's bugs. When Celery reports such
a failure (``task_failure``, sent inside the task's transaction), the transaction is
given the status that says what happened instead:

* ``DeadlineRefused`` (the retry gate; a child refused at enqueue; a call refused at
  the outbound gate; a run's outcome ``DeadlineRefused``): ``deadline_exceeded``;
  with the reason ``invalid_deadline``: ``invalid_argument``
* ``DispatchRefused`` ``deadline_passed``: ``deadline_exceeded``
* ``DispatchRefused`` ``stale_lease`` (another attempt owns the run): ``aborted``
* ``DispatchRefused`` ``unresolved``, ``stale_evidence``; ``PlanRefused``:
  ``failed_precondition``

Only for an exception the task lists in its ``throws`` (a body's own error keeps
Sentry's ``internal_error`` and its event), and only a status of ``internal_error`` is
replaced (one the application set stays). It is set on the span current when Celery
reports the failure: the task's transaction. Its ``queue.process`` child span, which
Sentry closed with ``internal_error`` as the exception left the body, keeps it.

The contract, as :mod:`celery_deadlines.contrib.opentelemetry`'s for OpenTelemetry: these functions
never raise and never import sentry-sdk. They look for ``sentry_sdk`` in
``sys.modules``: a transaction can be current only if the application imported and
initialised it, so when it is absent the check is one dict lookup per failure.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any, Final

from celery.signals import task_failure

from ..errors import DeadlineRefused, DispatchRefused, PlanRefused
from ..rules.gates import Reason

logger = logging.getLogger("celery_deadlines")

#: The module whose presence means a transaction may be current (see the docstring).
_SDK: Final = "sentry_sdk"
#: The status Sentry's Celery integration gives any exception out of a body.
INTERNAL_ERROR: Final = "internal_error"
#: Sentry's span statuses (gRPC's codes) this module writes.
DEADLINE_EXCEEDED: Final = "deadline_exceeded"
INVALID_ARGUMENT: Final = "invalid_argument"
ABORTED: Final = "aborted"
FAILED_PRECONDITION: Final = "failed_precondition"

#: A dispatch refusal's status by its reason (any other: ``failed_precondition``).
DISPATCH_STATUS: Final[Mapping[str, str]] = {
    "deadline_passed": DEADLINE_EXCEEDED,
    "stale_lease": ABORTED,
}

_DISPATCH_UID: Final = "celery_deadlines.contrib.sentry.on_task_failure"


def status_of(exception: BaseException | None, throws: Any) -> str | None:
    """The span status of ``exception``, an expected refusal (in ``throws``, the task's);
    ``None`` for anything else: Sentry's own status stands."""
    if not isinstance(exception, (DeadlineRefused, DispatchRefused, PlanRefused)):
        return None
    try:
        expected = isinstance(exception, tuple(throws))
    except TypeError:  # a task option that is not a tuple of classes: not ours to judge
        return None
    if not expected:
        return None
    if isinstance(exception, DeadlineRefused):
        invalid = exception.reason == Reason.INVALID_DEADLINE
        return INVALID_ARGUMENT if invalid else DEADLINE_EXCEEDED
    if isinstance(exception, DispatchRefused):
        return DISPATCH_STATUS.get(exception.reason, FAILED_PRECONDITION)
    return FAILED_PRECONDITION


def on_task_failure(sender: Any = None, exception: BaseException | None = None, **_: Any) -> None:
    """Celery's ``task_failure`` receiver: an expected refusal's status on the current
    Sentry span, in place of Sentry's ``internal_error``."""
    sdk: Any = sys.modules.get(_SDK)
    if sdk is None:  # every failure: one lookup when nobody reports to Sentry
        return
    status = status_of(exception, getattr(sender, "throws", ()))
    if status is None:
        return
    try:
        span = sdk.get_current_span()
        if span is not None and getattr(span, "status", None) == INTERNAL_ERROR:
            span.set_status(status)
    except Exception:  # a report must never change an outcome
        logger.debug("setting the Sentry status of a refusal failed", exc_info=True)


def connect() -> None:
    """Connect :func:`on_task_failure` (idempotent: one receiver per process)."""
    task_failure.connect(on_task_failure, weak=False, dispatch_uid=_DISPATCH_UID)


__all__ = ["DISPATCH_STATUS", "connect", "on_task_failure", "status_of"]
