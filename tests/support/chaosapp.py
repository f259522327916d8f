"""The nemesis soak's workload (``tests/chaos``): orders that pay through the provider
process (``tests/support/sink.py``) and send a completion notice as a child run.

Workers run ``celery -A tests.support.chaosapp worker``: the ledger app of
``tests/support/ledgerapp.py`` (its settings come from the same TEST_* variables) with
the soak's tasks added. ``c.order`` is published by the soak's producer processes:

* ``plain``: work ``work`` seconds, pay once (key ``fenced-<order>:pay``, a
  fencing-aware provider), then publish ``c.notice`` (task id ``<order>.notice``), a
  delivery task that calls a second provider key (``fenced-<order>:notice``). The
  notice must not be lost, so it is published as the docs say for such a child: inside
  a transaction, through the outbox (a broker down then delays it until the sweeper
  publishes it; outside one, the broker's error would fail the paid order);
* ``retry``: the same, after one retry;
* ``ackloss``: the provider takes the payment and the reply is lost (the reconciler
  asks the provider);
* ``expire``: dawdles past its deadline before paying: the deadline's cap must end it,
  and the provider must never see the call.

Every order rides out a database cut as docs/howto/database-outage.md says ("Ride out a database
outage"): the library's own writes wait it out, and the body's own transaction (the
notice's outbox row) is retried through the retry gate (``autoretry_for`` Django's
connection errors), so its next attempt replays the payment from the effect ledger.
"""

from __future__ import annotations

import time
from typing import Any

from django.db import InterfaceError, OperationalError, transaction

from celery_deadlines import DeadlineTask
from tests.support.ledgerapp import _pay_once, app, find_remote_payment

__all__ = ["app", "notice", "order"]

#: How long an ``expire`` order dawdles before paying (its budget is far shorter).
DAWDLE = 30.0


def pay_key(order_id: str, flavour: str) -> str:
    prefix = "fenced-ackloss-" if flavour == "ackloss" else "fenced-"
    return f"{prefix}{order_id}:pay"


def notice_key(order_id: str) -> str:
    return f"fenced-{order_id}:notice"


def notice_id(order_id: str) -> str:
    return f"{order_id}.notice"


def _work(task: DeadlineTask, seconds: float) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.05)


@app.task(
    base=DeadlineTask, bind=True, name="c.order", reconcilers={"pay": find_remote_payment},
    autoretry_for=(OperationalError, InterfaceError), retry_backoff=True, retry_backoff_max=8,
    max_retries=None,
)  # fmt: skip
def order(self: DeadlineTask, order_id: str, flavour: str, work: float) -> Any:
    if flavour == "retry" and not self.request.retries:
        raise self.retry(countdown=0.2)
    _work(self, DAWDLE if flavour == "expire" else work)
    paid = _pay_once(self, "pay", pay_key(order_id, flavour))
    with transaction.atomic(using=app.conf.deadlines_database):
        notice.apply_async((order_id,), task_id=notice_id(order_id))
    return paid


@app.task(
    base=DeadlineTask, bind=True, name="c.notice", deadline_kind="delivery",
    reconcilers={"notice": find_remote_payment},
)  # fmt: skip
def notice(self: DeadlineTask, order_id: str) -> Any:
    """The completion notice: a delivery with its own provider key."""
    return _pay_once(self, "notice", notice_key(order_id))
