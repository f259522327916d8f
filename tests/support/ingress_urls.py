"""Views that publish a task while a request is handled, under DeadlineMiddleware.

Each view publishes ``t.probe`` (the task :mod:`tests.support.workerapp` runs in the
integration tests' workers) through :data:`app`, on the memory broker unless a test points
it at a real one, and answers what it saw: the task's id and the deadline a message
published right then inherits (``None``: no scope). :data:`app` is never the current
app, so that importing this module changes nothing for other tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery
from django.http import HttpRequest, JsonResponse
from django.urls import include, path
from django.views import View

from celery_deadlines import DeadlineTask
from celery_deadlines.clock import get_clock
from celery_deadlines.core.propagation import inherited
from celery_deadlines.middleware import deadline_budget

app = Celery("ingress-views", set_as_current=False)
app.conf.update(
    broker_url="memory://",
    result_backend="cache+memory://",
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    deadlines_ledger=False,
)


@app.task(base=DeadlineTask, bind=True, name="t.probe", shared=False)
def probe(self: DeadlineTask, label: str = "") -> None:
    """Stands for tests.support.workerapp's t.probe, which the workers run."""


def sync_only(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
    """A middleware that can only run synchronously: under ASGI, Django runs it in a
    thread, and what comes after it through async_to_sync."""

    def middleware(request: HttpRequest) -> Any:
        return get_response(request)

    return middleware


def published(label: str) -> JsonResponse:
    deadline = inherited().deadline
    result: Any = probe.apply_async((label,))
    return JsonResponse(
        {"task_id": result.id, "deadline": None if deadline is None else deadline.timestamp()}
    )


@deadline_budget(60)
def budgeted(request: HttpRequest) -> JsonResponse:
    return published("budgeted")


@deadline_budget(60)
async def budgeted_async(request: HttpRequest) -> JsonResponse:
    return published("async")


def named(request: HttpRequest) -> JsonResponse:
    """No decorator: its budget comes from CELERY_DEADLINES_REQUEST_BUDGETS."""
    return published("named")


@deadline_budget(4)
class Classy(View):
    def get(self, request: HttpRequest) -> JsonResponse:
        return published("class")


@deadline_budget(None)
def opted_out(request: HttpRequest) -> JsonResponse:
    return published("opted_out")


def unbudgeted(request: HttpRequest) -> JsonResponse:
    return published("unbudgeted")


@deadline_budget(60)
def broken(request: HttpRequest) -> JsonResponse:
    raise RuntimeError("the view failed")


def decided(request: HttpRequest) -> JsonResponse:
    """What the view reads of the request's deadline, as the how-to shows it."""
    decision = request.deadline_decision  # type: ignore[attr-defined]
    left = decision.remaining(get_clock().now())
    inherits = inherited().deadline  # what a task it published now would carry
    return JsonResponse(
        {
            "deadline": None if decision.deadline is None else decision.deadline.timestamp(),
            "source": decision.source,
            "left": None if left is None else left.total_seconds(),
            "ignored": [ignored.header for ignored in decision.ignored],
            "inherited": None if inherits is None else inherits.timestamp(),
        }
    )


@deadline_budget(8)
def decided_budgeted(request: HttpRequest) -> JsonResponse:
    return decided(request)


@deadline_budget(8)
async def decided_async(request: HttpRequest) -> JsonResponse:
    return decided(request)


views = [
    path("budgeted/", budgeted, name="budgeted"),
    path("async/", budgeted_async, name="async"),
    path("named/", named, name="named"),
    path("class/", Classy.as_view(), name="class"),
    path("opted-out/", opted_out, name="opted_out"),
    path("api/report/", unbudgeted, name="report"),
    path("unbudgeted/", unbudgeted, name="unbudgeted"),
    path("broken/", broken, name="broken"),
    path("decided/", decided_budgeted, name="decided"),
    path("decided-async/", decided_async, name="decided_async"),
    path("decided-none/", decided, name="decided_none"),
]
urlpatterns = [path("", include((views, "ingress")))]
