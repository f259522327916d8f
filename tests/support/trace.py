"""Execute a published message the way a worker's pool process does, without a worker.

The message is read from kombu's in-memory transport and handed to Celery's own tracer
(``celery.app.trace.build_tracer``, what the prefork pool runs), with the request a
worker builds from its headers and what its main process hands the pool with a job (a
DeadlineTask's time limits: ``DeadlineRequest.time_limits``): ``before_start`` claims,
the body runs under the claim, failures are stored in the result backend. Only the
broker round trip is missing, so these are Django-tier tests; tests of the process
boundary run real workers.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.app.trace import build_tracer
from kombu import Message
from kombu.utils.json import dumps

from celery_deadlines import DeadlineTask
from celery_deadlines.core.request import DeadlineRequest
from celery_deadlines.core.timelimits import HANDED
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
        **handed_by_the_main_process(app, task, message),
    }
    tracer = build_tracer(task.name, task, eager=False, app=app, hostname=hostname)
    retval, info, _runtime, _text = tracer(headers["id"], args, kwargs, request)
    if info is None:
        return "SUCCESS", retval
    return info.state, getattr(retval, "exception", retval)  # a failure's ExceptionInfo


def handed_by_the_main_process(app: Celery, task: Any, message: dict[str, Any]) -> dict[str, Any]:
    """What a worker's main process adds to a DeadlineTask's job as it hands it to the
    pool: the time limits it is given, and who set each (read from Celery's request
    of the message, as ``execute_using_pool`` reads them)."""
    if not isinstance(task, DeadlineTask):
        return {}
    request = DeadlineRequest(
        Message(
            body=dumps(message["body"]),
            content_type="application/json",
            content_encoding="utf-8",
            headers=message["headers"],
            delivery_info={"exchange": "", "routing_key": ""},
        ),
        app=app,
        task=task,
    )
    request.time_limits  # noqa: B018 - what Celery reads right before the pool gets the job
    return {HANDED: request._request_dict[HANDED]}
