"""The ledger app's tasks (``tests.support.ledgerapp``) and one more for the Sentry tests:
a payment that kills its pool process after the call, and whose task has no reconciler,
so only an operator can say what became of it.

The test process imports this module to publish; the worker imports it through
``tests.support.sentryapp``, which adds Sentry.
"""

from __future__ import annotations

import os
import signal

from celery_deadlines import DeadlineTask
from tests.support.ledgerapp import app, sink

__all__ = ["app", "pay_then_die"]


@app.task(base=DeadlineTask, bind=True, name="s.pay_then_die")
def pay_then_die(self: DeadlineTask, key: str) -> None:
    """Pays, then its pool process dies before the outcome is recorded: the effect stays
    DISPATCHED, the lease lapses, and no reconciler of this task can settle it."""
    with self.effect("pay", key=key, fingerprint={"key": key}):
        sink("effect", key, self)
        os.kill(os.getpid(), signal.SIGKILL)
