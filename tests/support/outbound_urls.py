"""The views of the service the outbound tests call, behind DeadlineMiddleware
(tests/support/outbound_settings.py), in a server process of its own
(tests/support/outbound_server.py).

``/publish/`` publishes ``o.probe`` (which the test's worker runs:
tests/support/outboundapp.py) through :data:`app`, on the broker and queue the
environment names, and answers the task's id and the deadline the view ran under.
``/slow/`` answers nothing for a minute: a service that ignores the deadline.

The retry tests' views keep each request they receive (its arrival, by this process's
wall clock, and the deadline headers it carried, as they came: no deadline scope), by
key, and ``/seen/<key>/`` answers them: ``/unavailable/<key>/`` answers 503 (with the
``Retry-After`` its query's ``retry_after`` names), ``/stall/<key>/`` nothing for a
minute.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from typing import Any

from celery import Celery
from django.http import HttpRequest, JsonResponse
from django.urls import path

from celery_deadlines import DeadlineTask
from celery_deadlines.core.propagation import inherited
from celery_deadlines.middleware import deadline_budget

app = Celery("outbound-service", set_as_current=False)
app.conf.update(
    broker_url=os.environ.get("TEST_BROKER_URL", "memory://"),
    result_backend=os.environ.get("TEST_RESULT_BACKEND", "cache+memory://"),
    task_default_queue=os.environ.get("TEST_QUEUE", "celery"),
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    deadlines_ledger=False,  # the service publishes; the worker's ledger records the run
)


@app.task(base=DeadlineTask, bind=True, name="o.probe", shared=False)
def probe(self: DeadlineTask) -> None:
    """Stands for tests.support.outboundapp's o.probe, which the worker runs."""


@deadline_budget(60)  # far longer than any caller's: the header shortens it
def publish(request: HttpRequest) -> JsonResponse:
    deadline = inherited().deadline
    result: Any = probe.apply_async()
    return JsonResponse(
        {"task_id": result.id, "deadline": None if deadline is None else deadline.timestamp()}
    )


@deadline_budget(60)
def slow(request: HttpRequest) -> JsonResponse:
    time.sleep(60)  # the slowness under test: the caller's deadline is long gone
    return JsonResponse({})


#: the deadline headers the library sends by default
DEADLINE_HEADERS = ("grpc-timeout", "x-request-timeout-ms", "x-request-deadline")
_seen: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
_seen_lock = threading.Lock()


def _keep(request: HttpRequest, key: str) -> None:
    arrival = {"at": time.time(), **{name: request.headers.get(name) for name in DEADLINE_HEADERS}}
    with _seen_lock:
        _seen[key].append(arrival)


@deadline_budget(None)  # the headers as they came are under test: no scope reads them
def unavailable(request: HttpRequest, key: str) -> JsonResponse:
    _keep(request, key)
    response = JsonResponse({}, status=503)
    if "retry_after" in request.GET:
        response["Retry-After"] = request.GET["retry_after"]
    return response


@deadline_budget(None)
def stall(request: HttpRequest, key: str) -> JsonResponse:
    _keep(request, key)
    time.sleep(60)  # the slowness under test: the caller's read times out
    return JsonResponse({})


def seen(request: HttpRequest, key: str) -> JsonResponse:
    with _seen_lock:
        return JsonResponse({"requests": list(_seen[key])})


urlpatterns = [
    path("publish/", publish),
    path("slow/", slow),
    path("unavailable/<str:key>/", unavailable),
    path("stall/<str:key>/", stall),
    path("seen/<str:key>/", seen),
]
