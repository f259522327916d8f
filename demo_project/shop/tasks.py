"""The shop's tasks: one order, one deadline, every hop honouring it.

``place_order`` is published with a budget; everything it sends inherits that deadline
(and can only shorten it). ``charge_card`` talks to a payment provider that is down:
its retries back off until the next one would not fit in the time left, and the run
ends with ``retry_budget_exhausted``. ``print_label`` goes to the warehouse queue, whose
worker is late: the message waits there past its (shorter, per-task) deadline, the run
ledger's sweeper expires the run (``deadline_passed``) and the warehouse worker,
when it comes back, refuses to start it.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings

from celery_deadlines import SOURCE_HEADER, Assumption, DeadlineTask, Plan, steps_of
from celery_deadlines.core.effects import Found, NotFound, PendingEffect

from . import fulfillment, provider

#: How long the address change waits before trying the fulfillment service again.
ADDRESS_RETRY_IN = 8.0


class ProviderDown(Exception):
    """The payment provider did not answer (transient: worth a retry, if time allows)."""


def seen(task: DeadlineTask, **extra: Any) -> dict[str, Any]:
    """What a task reports about its own deadline, for the demo's explanation."""
    deadline = task.deadline
    return {
        "deadline": deadline.isoformat() if deadline else None,
        "source": (task.request.headers or {}).get(SOURCE_HEADER),
        "time_left_at_start": round(task.remaining(), 3),
        "attempt": task.request.retries + 1,
        **extra,
    }


@shared_task(base=DeadlineTask, bind=True, reserve=1)
def place_order(self: DeadlineTask, order_id: int) -> dict[str, Any]:
    started = seen(self)
    children = {
        "reserve_stock": reserve_stock.delay(order_id).id,
        "charge_card": charge_card.delay(order_id, 4200).id,
        "print_label": print_label.apply_async((order_id,), queue=settings.DEMO_WAREHOUSE_QUEUE).id,
        "capture_payment": capture_payment.delay(order_id, 4200).id,
        "send_confirmation": send_confirmation.delay(order_id).id,
    }
    return {**started, "children": children}


@shared_task(base=DeadlineTask, bind=True)
def reserve_stock(self: DeadlineTask, order_id: int) -> dict[str, Any]:
    started = seen(self)
    time.sleep(0.2)  # the stock service
    return {**started, "reserved": True}


@shared_task(
    base=DeadlineTask,
    bind=True,
    autoretry_for=(ProviderDown,),
    retry_backoff=1,
    retry_jitter=False,
    max_retries=10,
    attempt_timeout=2,
)
def charge_card(self: DeadlineTask, order_id: int, amount_cents: int) -> dict[str, Any]:
    raise ProviderDown(f"provider timed out on attempt {self.request.retries + 1}")


@shared_task(base=DeadlineTask, bind=True)
def print_label(self: DeadlineTask, order_id: int) -> dict[str, Any]:
    return {**seen(self), "printed": True}


def find_capture(pending: PendingEffect) -> Found | NotFound:
    """Asked only when a capture's outcome is unknown: what does the provider have?"""
    found = provider.lookup(pending.key)
    if found is None:
        return NotFound(evidence="provider lookup: no charge")
    return Found(found, evidence=f"provider lookup: {found['id']}")


@shared_task(base=DeadlineTask, bind=True, reconcilers={"capture": find_capture})
def capture_payment(self: DeadlineTask, order_id: int, amount_cents: int) -> dict[str, Any]:
    """One charge per order, whatever the provider does (it loses its first reply)."""
    started = seen(self)
    key = f"order-{order_id}:capture:v1"
    with self.effect("capture", key=key, fingerprint={"amount": amount_cents}) as fx:
        if fx.completed:  # reconciled after the lost reply: replay, never charge again
            return {**started, "charge": fx.result, "replayed": True}
        fx.succeed(provider.charge(fx.key, amount_cents))
    return {**started, "charge": fx.result, "replayed": False}


@shared_task(base=DeadlineTask, bind=True, deadline_kind="delivery")
def send_confirmation(self: DeadlineTask, order_id: int) -> dict[str, Any]:
    """A notice: governed by the order's delivery deadline, not its execution deadline."""
    with self.effect("email", key=f"order-{order_id}:confirmation:v1") as fx:
        if not fx.completed:
            fx.succeed({"to": f"customer-of-order-{order_id}", "sent": True})
    return {**seen(self), "notice": fx.result}


@shared_task(base=DeadlineTask, bind=True, max_retries=3)
def change_address(self: DeadlineTask, order_id: int, address: str) -> dict[str, Any]:
    """The address-change story: plan the change from what the customer confirmed, and resume the
    plan only if the world still matches it (its contract is in settings:
    ``on_expiry: refuse``, so a plan that no longer applies ends the run, with why)."""
    facts = fulfillment.facts(order_id)  # read now, every attempt
    evidence = [  # stamped by the ledger's clock, with this attempt's token
        self.observe(source, value, evidence_id=f"fulfillment:order-{order_id}:{source}")
        for source, value in facts.items()
    ]
    verdict = self.resume_plan(current=facts)  # PlanRefused if the world moved on
    if verdict is None:  # the first attempt: plan from what was just read, then check it
        now = self.ledger_now()
        self.save_plan(
            Plan(
                steps=({"do": "update_address", "order": order_id, "to": address},),
                assumptions=(
                    Assumption("order_state", "open"),
                    Assumption("customer_confirmation", "confirmed"),
                ),
                created_at=now,
                valid_until=now + timedelta(minutes=5),
                plan_id=f"address-{order_id}",
            )
        )
        verdict = self.resume_plan(current=facts)
        assert verdict is not None
    for step in steps_of(verdict):
        key = f"order-{order_id}:address:v1"
        unavailable = fulfillment.FulfillmentUnavailable
        try:
            # a commit: the guard wants both facts fresh and read by this attempt
            with self.effect("update_address", key=key, fingerprint=step, evidence=evidence,
                             action="commit", not_sent=(unavailable,)) as fx:  # fmt: skip
                if not fx.completed:
                    fx.succeed(fulfillment.update_address(order_id, address))
        except unavailable as exc:  # certainly not applied: come back later
            raise self.retry(exc=exc, countdown=ADDRESS_RETRY_IN) from exc
    return {**seen(self), "address": address}


# The gift-wrap workflow (views.gift_wrap): two steps whose declared attempt timeouts
# (6 s + 5 s) cannot fit in a checkout's 8 s, so the workflow gate refuses the chain whole.
@shared_task(base=DeadlineTask, bind=True, attempt_timeout=6)
def wrap_gift(self: DeadlineTask, order_id: int) -> dict[str, Any]:
    return seen(self)


@shared_task(base=DeadlineTask, bind=True, attempt_timeout=5)
def engrave_card(self: DeadlineTask, order_id: int) -> dict[str, Any]:
    return seen(self)
