"""The view a request places an order through: under ``ATOMIC_REQUESTS`` the order's
run row is written in the request's transaction and its message published when it
commits; the request's budget (``@deadline_budget``) is the order's deadline."""

from __future__ import annotations

from celery.result import EagerResult
from django.http import HttpRequest, JsonResponse

from celery_deadlines.middleware import deadline_budget

from .tasks import place

#: The request's budget: the order, its charge and everything they publish share it.
ORDER_BUDGET = 20


@deadline_budget(ORDER_BUDGET)
def place_order(request: HttpRequest, key: str) -> JsonResponse:
    """The order's task id; with ``task_always_eager`` (local development), the order ran
    in this request: its state and value too."""
    result = place.delay(key)
    answer: dict[str, object] = {"task_id": str(result.id)}
    if isinstance(result, EagerResult):
        answer.update(state=result.state, value=result.result if result.successful() else None)
    return JsonResponse(answer)
