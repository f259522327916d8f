"""Views of a project that switched its tasks to DeadlineTask, under ``ATOMIC_REQUESTS``
(docs/howto/switching.md): each publishes a task with the run ledger on and answers whether
its message had left by the time the view returned (``SENT``: the ids published, filled
by the test)."""

from __future__ import annotations

from typing import Any

from celery import Celery
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.urls import path

from celery_deadlines import DeadlineTask

app = Celery("switching-views", set_as_current=False)
app.conf.update(broker_url="memory://", result_backend="cache+memory://")

#: The ids of the messages published, in order (the test connects the receiver).
SENT: list[str] = []


@app.task(base=DeadlineTask, name="switching.ship", budget=30, shared=False)
def ship(order_id: int) -> int:
    return order_id


def answer(result: Any) -> JsonResponse:
    return JsonResponse({"id": result.id, "sent_before_the_view_returned": result.id in SENT})


def in_the_requests_transaction(request: HttpRequest) -> JsonResponse:
    return answer(ship.delay(1))


@transaction.non_atomic_requests
def outside_it(request: HttpRequest) -> JsonResponse:
    return answer(ship.delay(2))


urlpatterns = [
    path("atomic/", in_the_requests_transaction),
    path("non-atomic/", outside_it),
]
