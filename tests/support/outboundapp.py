"""The ledger app of tests.support.ledgerapp with the tasks of the outbound tests: bodies
that call the service of tests/support/outbound_server.py through httpx, under their
deadline (``celery -A tests.support.outboundapp worker``, with the ledger's settings).
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from celery_deadlines import DeadlineTask
from celery_deadlines.contrib.httpx import deadline_hooks
from tests.support.ledgerapp import app

__all__ = ["app", "call_late", "call_service", "call_slow", "probe"]


def _deadline(task: DeadlineTask) -> float:
    deadline = task.deadline
    assert deadline is not None
    return deadline.timestamp()


@app.task(base=DeadlineTask, bind=True, name="o.probe")
def probe(self: DeadlineTask) -> dict[str, Any]:
    """Published by the service's view: the deadline it runs under."""
    return {"deadline": _deadline(self), "remaining": self.remaining()}


@app.task(base=DeadlineTask, bind=True, name="o.call_service")
def call_service(self: DeadlineTask, url: str) -> dict[str, Any]:
    """Call the service (its caller's own timeout: 30 s) and return what it answered."""
    with httpx.Client(event_hooks=deadline_hooks(), timeout=30) as client:
        answer = client.get(url).raise_for_status().json()
    return {"deadline": _deadline(self), "answer": answer}


@app.task(base=DeadlineTask, bind=True, name="o.call_late")
def call_late(self: DeadlineTask, url: str, reserve: float) -> None:
    """Call once less than ``reserve`` is left: the outbound gate refuses the call."""
    while self.remaining() >= reserve:
        time.sleep(0.05)  # the delay under test: the time left runs down
    with httpx.Client(event_hooks=deadline_hooks(reserve=reserve), timeout=30) as client:
        client.get(url)


@app.task(base=DeadlineTask, bind=True, name="o.call_slow")
def call_slow(self: DeadlineTask, url: str, key: str, reserve: float) -> None:
    """Call a service that does not answer in time, as a side effect: the call is cut
    when its time is up, and the effect's outcome is unknown."""
    with (
        self.effect("slow_service", key=key, fingerprint={"url": url}),
        httpx.Client(event_hooks=deadline_hooks(reserve=reserve), timeout=30) as client,
    ):
        client.get(url)
