"""The shop's web side: an order's deadline starts with the customer's request.

``checkout`` has the budget the customer's page has (``@deadline_budget``): every task it
publishes inherits that deadline, exactly as a child inherits its parent's.
``gift_wrap`` enqueues a two-step chain whose declared attempt timeouts add up to more
than the request has: the workflow gate refuses it whole, before anything is published,
and the view answers with the arithmetic.
"""

from __future__ import annotations

from celery import chain
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from celery_deadlines import WorkflowRefused
from celery_deadlines.middleware import deadline_budget

from .tasks import engrave_card, place_order, wrap_gift

#: What the customer's checkout page waits for, and so what the order has.
CHECKOUT_BUDGET = 8.0
#: The confirmation e-mail may arrive later than the page: its own delivery budget.
DELIVERY_BUDGET = 60.0


@require_POST
@deadline_budget(CHECKOUT_BUDGET)
def checkout(request: HttpRequest, order_id: int) -> JsonResponse:
    order = place_order.apply_async((order_id,), delivery_budget=DELIVERY_BUDGET)
    return JsonResponse({"order": order.id})


@require_POST
@deadline_budget(CHECKOUT_BUDGET)
def gift_wrap(request: HttpRequest, order_id: int) -> JsonResponse:
    try:
        chain(wrap_gift.si(order_id), engrave_card.si(order_id)).apply_async()
    except WorkflowRefused as refused:
        return JsonResponse({"refused": refused.reason, "detail": refused.detail}, status=503)
    return JsonResponse({"queued": True})
