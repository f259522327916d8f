"""Cancel a run with everything it started (``celery_deadlines.cancel``): the ledger's
deadline pulled in, for the run and every descendant it recorded.

A cancel is a deadline, not a message to a worker: it is one write to the ledger, read
by whoever acts on a run next (the claim refuses it ``cancelled``, a renewal past it
fails, the sweeper ends it ``cancelled``), so it reaches work queued behind a busy
worker, and work whose worker is down, as Celery's ``revoke`` cannot.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from celery import current_app

from .. import ledger
from ..errors import ConfigurationError

#: Who cancelled, when the caller does not say (each run's history keeps it).
BY_DEFAULT = "celery_deadlines.cancel()"


def cancel(
    task_id: str,
    *,
    reason: str = "",
    at: datetime | None = None,
    by: str = BY_DEFAULT,
    app: Any = None,
) -> int:
    """Cancel the run of ``task_id`` and every run it started, down its tree: each
    unended one's deadline is pulled in to now (``at``: an earlier instant, aware),
    never lengthened, and marked ``cancelled`` with ``reason`` and ``by`` in its
    history, in one statement whatever the tree's size.

    Queued runs are refused at their claim (nothing of their bodies runs) or ended by
    the reconciler's sweeper, with the reason ``cancelled``, and their callers see
    ``REVOKED`` (``TaskRevokedError('revoked')``); a running attempt's next lease
    renewal fails, and it is refused a retry. Returns how many runs it changed: 0 for a
    run that had ended, or that the ledger does not hold.

    The ledger is required (``"celery_deadlines"`` in ``INSTALLED_APPS``): without it
    no run's descendants are known; :class:`~celery_deadlines.errors.ConfigurationError`.
    """
    app = app or current_app
    if not ledger.active() or not ledger.enabled_for(app):
        raise ConfigurationError(
            "cancel needs the run ledger (celery_deadlines in INSTALLED_APPS): without "
            "it no run's descendants are known; Celery's revoke(task_id) stops one "
            "message on the workers that are up"
        )
    if at is not None and at.tzinfo is None:
        raise ValueError(f"cancel: at={at!r} is naive; give an aware datetime")
    from ..ledger import api, operations

    return operations.cancel_run(api.store_for(app), task_id, reason=reason, by=by, at=at)
