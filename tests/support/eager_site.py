"""A developer's site run eagerly, as cookiecutter-django's local settings run it
(``CELERY_TASK_ALWAYS_EAGER = True``): views that create a row in the request's
transaction and call ``.delay()`` of DeadlineTasks whose bodies perform side effects.

:data:`app` is never the current app. The provider appends each call it takes to the
file ``EAGER_SINK`` names, so that a second process (``manage.py shell -c`` with the
same settings: tests/support/eager_settings.py) counts its calls with the first's;
``EAGER_UNREACHABLE`` names orders whose first call finds the provider unreachable.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery
from django.contrib.auth.models import User
from django.http import HttpRequest, JsonResponse
from django.urls import path

from celery_deadlines import DeadlineTask

app = Celery("eager-site", set_as_current=False)
app.conf.update(
    broker_url="memory://",
    result_backend="cache+memory://",
    task_always_eager=True,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    deadlines_database=os.environ.get("EAGER_DATABASE", "default"),
)


class ProviderUnreachable(ConnectionError):
    """The provider could not be reached: the call never left."""


def provider_calls() -> list[str]:
    """The calls the provider took, in order (``"charge o-1 12"``), from every process."""
    sink = Path(os.environ["EAGER_SINK"])
    return sink.read_text().splitlines() if sink.exists() else []


def provider(kind: str, order: str, amount: int = 0) -> str:
    """The payment and mail provider: unreachable once for an order ``EAGER_UNREACHABLE``
    names (that first call is not taken), otherwise the call is taken and counted."""
    unreachable = os.environ.get("EAGER_UNREACHABLE", "").split(",")
    if order in unreachable and not any(
        line.startswith(f"refused {kind} {order}") for line in provider_calls()
    ):
        taken = f"refused {kind} {order}"
        error: Exception | None = ProviderUnreachable(order)
    else:
        taken, error = f"{kind} {order} {amount}", None
    with open(os.environ["EAGER_SINK"], "a", encoding="utf-8") as sink:
        sink.write(f"{taken}\n")
    if error is not None:
        raise error
    return f"{kind}-receipt-{order}"


@app.task(base=DeadlineTask, bind=True, name="eager.charge", budget=60, shared=False)
def charge(self: DeadlineTask, order: str, amount: int) -> str:
    try:
        with self.effect(
            "charge",
            key=f"order-{order}:charge",
            fingerprint={"amount": amount},
            not_sent=(ProviderUnreachable,),
        ) as fx:
            if fx.completed:
                return str(fx.result)
            receipt = provider("charge", order, amount)
            fx.succeed(receipt)
    except ProviderUnreachable as unreachable:
        raise self.retry(exc=unreachable, countdown=5) from unreachable
    return receipt


@app.task(base=DeadlineTask, bind=True, name="eager.checkout", budget=60, shared=False)
def checkout(self: DeadlineTask, order: str, amount: int) -> dict[str, Any]:
    """Charges the order, then mails its confirmation: each a child run of its own (an
    eager child's result is ready: Celery forbids get() in a body)."""
    paid = charge.delay(order, amount)
    mail = confirm.delay(order)
    return {"charge": paid.id, "receipt": paid.result, "mail": mail.id, "mailed": mail.result}


@app.task(base=DeadlineTask, bind=True, name="eager.confirm", shared=False)
def confirm(self: DeadlineTask, order: str) -> str:
    with self.effect("mail", key=f"order-{order}:mail") as fx:
        if fx.completed:
            return str(fx.result)
        sent = provider("mail", order)
        fx.succeed(sent)
    return sent


@app.task(base=DeadlineTask, bind=True, name="eager.unbudgeted", budget=None, shared=False)
def unbudgeted(self: DeadlineTask, order: str) -> dict[str, Any]:
    """A task with no budget anywhere: it runs with no deadline."""
    with self.effect("charge", key=f"order-{order}:unbudgeted") as fx:
        if not fx.completed:
            fx.succeed(provider("charge", order))
    return {"remaining": self.remaining(), "token": self.lease.token if self.lease else None}


#: The slow task's lease (seconds): renewed a third of the way in.
SLOW_LEASE = 3.0


@app.task(
    base=DeadlineTask, bind=True, name="eager.slow", budget=60, lease_ttl=SLOW_LEASE, shared=False
)
def slow(self: DeadlineTask, order: str) -> str:
    """Outlives its lease's first renewal: waits until the ledger's row says the lease
    was renewed, or for two thirds of the lease, then charges (the dispatch guard and
    the run's end need the lease alive)."""
    from celery_deadlines.models import Run

    assert self.lease is not None
    claimed = self.lease.expires_at
    until = time.monotonic() + SLOW_LEASE * 2 / 3
    runs = Run.objects.using(app.conf.deadlines_database)
    while time.monotonic() < until:
        if runs.get(task_id=self.request.id).lease_expires_at != claimed:
            break
        time.sleep(0.05)
    with self.effect("charge", key=f"order-{order}:slow") as fx:
        if not fx.completed:
            fx.succeed(provider("charge", order))
    return f"charge-receipt-{order}"


@app.task(
    base=DeadlineTask,
    bind=True,
    name="eager.overlong",
    budget=60,
    lease_ttl=SLOW_LEASE,
    shared=False,
)
def overlong(self: DeadlineTask, order: str) -> str:
    """Runs past its lease's first term, then charges."""
    assert self.lease is not None
    time.sleep(SLOW_LEASE + 0.5)
    with self.effect("charge", key=f"order-{order}:overlong") as fx:
        if not fx.completed:
            fx.succeed(provider("charge", order))
    return f"charge-receipt-{order}"


#: The overdue task's budget (seconds), and how long its body works on past it.
OVERDUE_BUDGET, OVERDUE_PAST = 1.0, 0.3


@app.task(base=DeadlineTask, bind=True, name="eager.overdue", budget=OVERDUE_BUDGET, shared=False)
def overdue(self: DeadlineTask, order: str) -> str:
    """Works on past its deadline (nothing stops an eager body), then returns: until
    ``remaining()`` reaches 0, or as long as the budget again (no deadline reached it)."""
    until = time.monotonic() + 2 * OVERDUE_BUDGET
    while self.remaining() > 0 and time.monotonic() < until:
        time.sleep(0.05)
    time.sleep(OVERDUE_PAST)
    return f"late-{order}"


@app.task(base=DeadlineTask, bind=True, name="eager.broken", budget=60, shared=False)
def broken(self: DeadlineTask, order: str) -> None:
    raise ValueError(f"no price for {order}")


def order_view(request: HttpRequest, order: str) -> JsonResponse:
    """Create the customer in the request's transaction, then charge the order; with
    ``?fail=1`` the view fails after the charge (its transaction rolls back)."""
    customer = f"{order}-{uuid.uuid4().hex[:6]}"
    User.objects.db_manager(app.conf.deadlines_database).create(username=customer)
    result = charge.apply_async((order, 12), task_id=request.GET.get("task_id") or None)
    if request.GET.get("fail"):
        raise RuntimeError("the view failed after the charge")
    return JsonResponse({"task_id": result.id, "state": result.state, "receipt": result.get()})


def slow_view(request: HttpRequest, order: str) -> JsonResponse:
    task = overlong if request.GET.get("overlong") else slow
    result = task.delay(order)
    return JsonResponse({"task_id": result.id, "state": result.state, "receipt": result.get()})


def checkout_view(request: HttpRequest, order: str) -> JsonResponse:
    result = checkout.delay(order, 20)
    return JsonResponse({"task_id": result.id, **result.get()})


urlpatterns = [
    path("order/<str:order>", order_view),
    path("checkout/<str:order>", checkout_view),
    path("slow/<str:order>", slow_view),
]
