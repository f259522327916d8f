"""Execute a published message the way a worker's pool process does, without a worker.

The message is read from kombu's in-memory transport and handed to Celery's own tracer
(``celery.app.trace.build_tracer``, what the prefork pool runs), with the request a
worker builds from its headers: ``before_start`` claims, the body runs under the claim,
failures are stored in the result backend. Only the broker round trip is missing, so
these are Django-tier tests; tests of the process boundary run real workers.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.app.trace import build_tracer

from tests.support.memory_queue import drain


def execute_next(app: Celery, queue: str, hostname: str = "w1@test") -> tuple[str, Any]:
    """Run the one message waiting in ``queue``: (Celery's task state, its return value
    or exception)."""
    messages = drain(app, queue)
    assert len(messages) == 1, f"{len(messages)} messages in {queue}, expected one"
    return execute(app, messages[0], hostname)


def execute(app: Celery, message: dict[str, Any], hostname: str = "w1@test") -> tuple[str, Any]:
    headers = message["headers"]
    args, kwargs, _embed = message["body"]
    task = app.tasks[headers["task"]]
    request = {
        **headers,
        "hostname": hostname,
        "delivery_info": {"routing_key": headers.get("routing_key", ""), "exchange": ""},
        "is_eager": False,
        "args": args,
        "kwargs": kwargs,
    }
    tracer = build_tracer(task.name, task, eager=False, app=app, hostname=hostname)
    retval, info, _runtime, _text = tracer(headers["id"], args, kwargs, request)
    if info is None:
        return "SUCCESS", retval
    return info.state, getattr(retval, "exception", retval)  # a failure's ExceptionInfo
