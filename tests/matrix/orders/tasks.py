"""The scenario's tasks: what a project's tasks do, each reporting to two witnesses
outside the library. The **provider** (``tests/support/sink.py``, a process of its own at
``MATRIX_PROVIDER``) logs every call it receives; the **notes** (``MATRIX_NOTES``, a
JSONL file each body appends to with ``O_APPEND``) say what a body saw and did. The
tests judge the promises from those, the caller's ``AsyncResult``, the ledger's rows and
``manage.py deadlines explain``."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from typing import Any

import requests
from billiard.exceptions import SoftTimeLimitExceeded
from celery import shared_task

from celery_deadlines import DeadlineTask
from celery_deadlines.contrib.requests import DeadlineAdapter


def note(kind: str, key: str, **facts: Any) -> None:
    """One line in the notes file (one write(2) with O_APPEND)."""
    line = json.dumps({"kind": kind, "key": key, "pid": os.getpid(), "t": time.time(), **facts})
    fd = os.open(os.environ["MATRIX_NOTES"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def call_provider(key: str, body: dict[str, Any]) -> Any:
    """The provider's charge: one POST, logged by the provider before it answers."""
    request = urllib.request.Request(
        f"{os.environ['MATRIX_PROVIDER']}/effects/{key}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


@shared_task(base=DeadlineTask, bind=True, name="orders.place")
def place(self: DeadlineTask, key: str) -> dict[str, str]:
    """An order: its charge is a child task, published from the body (it inherits the
    order's deadline)."""
    child = charge.delay(key)
    return {"child": str(child.id)}


@shared_task(base=DeadlineTask, bind=True, name="orders.charge")
def charge(self: DeadlineTask, key: str) -> Any:
    """One charge per key, under the effect ledger."""
    with self.effect("charge", key=key, fingerprint={"key": key}) as fx:
        if fx.completed:
            return fx.result
        answer = call_provider(key, {"token": fx.token, "fence": fx.fence, "pid": os.getpid()})
        fx.succeed(answer)
    return fx.result


@shared_task(base=DeadlineTask, bind=True, name="orders.retry_late")
def retry_late(self: DeadlineTask, key: str) -> None:
    """A gateway that is down: retried in a minute, more than the deadline leaves."""
    note("attempt", key)
    raise self.retry(countdown=60, exc=RuntimeError("gateway down"))


@shared_task(base=DeadlineTask, bind=True, name="orders.retry_often", attempt_timeout=1)
def retry_often(self: DeadlineTask, key: str) -> None:
    """Retried at once, with Celery's own ``max_retries`` (3): four attempts, then the
    error, well before the deadline. Its attempts take a second at most (the retry gate
    reserves that; the project's 5-minute time limit would refuse every retry)."""
    note("attempt", key)
    raise self.retry(countdown=0.05, exc=RuntimeError("still down"))


@shared_task(base=DeadlineTask, bind=True, name="orders.overrun")
def overrun(self: DeadlineTask, key: str, past: float) -> str:
    """Work in short steps (sleeps: every pool can switch there) until ``past`` seconds
    after the deadline, noting a soft time limit if one comes; then try an effect and a
    call to another service, and note what each did."""
    note("start", key, remaining=self.remaining())
    while self.remaining() > -past:
        try:
            time.sleep(0.05)
        except SoftTimeLimitExceeded:
            note("soft", key, remaining=self.remaining())
    note("past", key, remaining=self.remaining())
    try:
        with self.effect("late", key=f"{key}-effect", fingerprint={"key": key}) as fx:
            answer = call_provider(f"{key}-effect", {"token": fx.token, "fence": fx.fence})
            fx.succeed(answer)
        note("effect-performed", key)
    except Exception as error:  # noqa: BLE001 - a witness: what the effect did, whatever it was
        note("effect-raised", key, error=type(error).__name__, text=str(error)[:300])
    session = requests.Session()
    session.mount("http://", DeadlineAdapter())
    try:
        session.post(f"{os.environ['MATRIX_PROVIDER']}/effects/{key}-call", json={}, timeout=5)
        note("call-sent", key)
    except Exception as error:  # noqa: BLE001 - a witness: what the call did, whatever it was
        note("call-raised", key, error=type(error).__name__, text=str(error)[:300])
    note("end", key, remaining=self.remaining())
    return "late"


@shared_task(base=DeadlineTask, bind=True, name="orders.dawdle")
def dawdle(self: DeadlineTask, key: str, seconds: float) -> str:
    """Work ``seconds`` in short steps, noting a soft time limit if one comes."""
    note("start", key, remaining=self.remaining())
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            time.sleep(0.05)
        except SoftTimeLimitExceeded:
            note("soft", key, remaining=self.remaining())
    note("end", key)
    return key
