"""What a caller is told of a delivery a gate refused, in Celery's terms.

A refusal is stored as the task's failure, the typed
:class:`~celery_deadlines.errors.DeadlineRefused`, except where Celery itself would have
discarded the message: when the governing deadline is Celery's own ``expires``
(``x_deadline_source`` ``expires``) and the refusal is for that deadline, the caller is
told what Celery tells of a message whose ``expires`` passed (state ``REVOKED``,
``TaskRevokedError('expired')``, ``task-revoked`` with ``expired=True``), so that an
``except TaskRevokedError`` written for Celery keeps catching it. The rule is
:func:`~celery_deadlines.rules.outcomes.told_as_celery_expiry`; the ledger keeps the
refusal's own reason either way. The ledger tells the runs it ends itself the same way
(:mod:`celery_deadlines.ledger.telling`).
"""

from __future__ import annotations

from typing import Any

from celery.worker.state import revoked

from .errors import DeadlineRefused
from .rules import outcomes, stamping


def tell_refused_message(request: Any, refusal: DeadlineRefused) -> None:
    """The claim gate's refusal of ``request`` (a worker request, in the worker's main
    process), once the ledger, if on, recorded it as the run's end: Celery's own expiry,
    announced as ``Request.revoked()`` announces it (``task-revoked``, ``REVOKED`` stored,
    the ``task_revoked`` signal; the id kept among the revoked, as its ``maybe_expire``
    keeps it), or ``task-failed`` and the typed refusal stored as the failure."""
    source = stamping.header_source(request._request_dict)
    if outcomes.told_as_celery_expiry(refusal.reason, source):
        revoked.add(request.id)
        request._announce_revoked(outcomes.CELERY_EXPIRED, False, None, True)
        return
    request.send_event("task-failed", exception=repr(refusal), traceback="")
    request.task.backend.mark_as_failure(
        request.id, refusal, request=request._context, store_result=request.store_errors
    )


def tell_refusal(
    backend: Any, task_id: str, refusal: DeadlineRefused, *, source: str | None, **store: Any
) -> None:
    """Store a refusal of the run ``task_id`` as its caller's result (``store``: the
    backend's ``request`` and ``store_result``): ``REVOKED`` with
    ``TaskRevokedError('expired')`` when it is told as Celery's expiry (``source``: where
    the message's deadline came from, :func:`~celery_deadlines.rules.stamping.header_source`),
    else the typed refusal as its failure."""
    if outcomes.told_as_celery_expiry(refusal.reason, source):
        backend.mark_as_revoked(task_id, outcomes.CELERY_EXPIRED, **store)
    else:
        backend.mark_as_failure(task_id, refusal, **store)


__all__ = ["tell_refusal", "tell_refused_message"]
