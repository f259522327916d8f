"""The worker app of the outbound retry tests (tests/integration/contrib/test_outbound_retries.py):
``tests.support.workerapp``'s app, without the ledger, with tasks whose body calls a
service through a client library that retries on its own (urllib3's ``Retry`` under
requests, httpcore's connect retries under httpx, a gRPC retry policy), under the
task's deadline.

Each body waits until no more than ``left`` seconds of its deadline are left (the
deadline is the test's, so the call's timing is the test's whatever the queue took),
makes one call, and answers what became of it (``answered`` and its status,
``refused`` and the gate's reason, or ``failed`` and the client's error) and the time
the task had left when the call ended.
"""

from __future__ import annotations

import json
import time
from typing import Any

from celery_deadlines import DeadlineRefused, DeadlineTask
from tests.support.workerapp import app

__all__ = ["app", "grpc_retrying", "httpx_retrying", "requests_retrying"]


def _wait_until(task: DeadlineTask, left: float) -> None:
    while task.remaining() > left:
        time.sleep(0.01)  # the delay under test: the time left runs down to ``left``


def _ended(task: DeadlineTask, outcome: dict[str, Any]) -> dict[str, Any]:
    return {**outcome, "remaining": task.remaining()}


def _refused(refused: DeadlineRefused) -> dict[str, Any]:
    return {"refused": [refused.gate, refused.reason], "detail": refused.detail}


@app.task(base=DeadlineTask, bind=True, name="o.requests_retrying")
def requests_retrying(
    self: DeadlineTask, url: str, retry: dict[str, Any], left: float, reserve: float
) -> dict[str, Any]:
    """GET ``url`` through a ``DeadlineAdapter`` whose ``max_retries`` is
    ``urllib3.Retry(**retry)`` (the caller's own timeout: 30 s)."""
    import requests
    from urllib3.util import Retry

    from celery_deadlines.contrib.requests import DeadlineAdapter

    session = requests.Session()
    session.mount("http://", DeadlineAdapter(max_retries=Retry(**retry), reserve=reserve))
    _wait_until(self, left)
    try:
        answer = session.get(url, timeout=30)
    except DeadlineRefused as refused:
        return _ended(self, _refused(refused))
    except requests.RequestException as error:
        return _ended(self, {"failed": type(error).__name__})
    return _ended(self, {"answered": answer.status_code})


@app.task(base=DeadlineTask, bind=True, name="o.httpx_retrying")
def httpx_retrying(
    self: DeadlineTask, url: str, retries: int, left: float, reserve: float
) -> dict[str, Any]:
    """GET ``url`` through an ``httpx.Client`` with the deadline hooks, on an
    ``HTTPTransport(retries=retries)`` (the caller's own timeout: 30 s)."""
    import httpx

    from celery_deadlines.contrib.httpx import deadline_hooks

    transport = httpx.HTTPTransport(retries=retries)
    hooks = deadline_hooks(reserve=reserve)
    with httpx.Client(transport=transport, event_hooks=hooks, timeout=30) as client:
        _wait_until(self, left)
        try:
            answer = client.get(url)
        except DeadlineRefused as refused:
            return _ended(self, _refused(refused))
        except httpx.HTTPError as error:
            return _ended(self, {"failed": type(error).__name__})
    return _ended(self, {"answered": answer.status_code})


@app.task(base=DeadlineTask, bind=True, name="o.grpc_retrying")
def grpc_retrying(
    self: DeadlineTask, address: str, retry_policy: dict[str, Any], left: float, reserve: float
) -> dict[str, Any]:
    """Call ``/t.Service/Flaky`` at ``address`` through a ``DeadlineInterceptor``, on a
    channel whose service config retries it by ``retry_policy`` (the caller's own
    timeout: 30 s). grpc is imported here, in the pool process that makes the call."""
    import grpc

    from celery_deadlines.contrib.grpc import DeadlineInterceptor

    config = {"methodConfig": [{"name": [{"service": "t.Service"}], "retryPolicy": retry_policy}]}
    options = [("grpc.service_config", json.dumps(config)), ("grpc.enable_retries", 1)]
    channel = grpc.intercept_channel(
        grpc.insecure_channel(address, options=options), DeadlineInterceptor(reserve=reserve)
    )
    flaky: Any = channel.unary_unary("/t.Service/Flaky")
    _wait_until(self, left)
    try:
        flaky(b"", timeout=30)
    except DeadlineRefused as refused:
        return _ended(self, _refused(refused))
    except grpc.RpcError as error:
        return _ended(self, {"failed": error.code().name})
    finally:
        channel.close()
    return _ended(self, {"answered": "OK"})
