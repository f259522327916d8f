"""What the ledger records of a Celery message: the run's outbox row, in Celery's terms.

:mod:`celery_deadlines.core.publishing` builds a new run's row here once the ledger is
on (:func:`message_of`, :func:`new_run`), recorded before its message is sent, or finds
the attempt running in this process that hands its run to its own retry message instead
(:func:`retrying`). A message that reaches
a worker without a row (sent by name, or before the app was installed) gets one rebuilt
from the request (:func:`run_of_request`). A gate's refusal (enqueue, claim gate,
attempt) is recorded by :func:`record_refusal`. The ledger is imported lazily: the
plain Celery tier never imports Django.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from celery._state import get_current_worker_task
from celery.exceptions import Retry

from .. import ledger
from ..ledger._crashpoints import hit
from ..rules import envelope, gates, wire
from ..rules.records import NewRun, Refusal
from ..rules.stamping import Stamp
from ..rules.states import Status
from .propagation import attempt_state, headers_of

if TYPE_CHECKING:
    from celery import Task

logger = logging.getLogger("celery_deadlines")


def message_of(
    task: Task[Any, Any], args: Any, kwargs: Any, call: dict[str, Any], links: dict[str, Any]
) -> tuple[bytes, str, str, object]:
    """The message the outbox keeps of a publish (body, content type, encoding) and the
    queue it goes to. ``call``: the publish's options as Celery will see them;
    ``links``: ``link``, ``link_error`` and ``shadow``, kept with the message so that a
    republish is the same message."""
    kept = {**task._get_exec_options(), **call, **links}  # type: ignore[attr-defined]
    if not (kept.get("queue") or kept.get("routing_key") or kept.get("exchange")):
        # Record the queue Celery routes it to here: a republish by another process
        # (a worker whose default queue or routes differ) must reach the same queue.
        queue = task.app.amqp.router.route({}, task.name, args, kwargs).get("queue")
        if queue is not None:
            kept["queue"] = getattr(queue, "name", queue)
    body, content_type, encoding = ledger.api_for(task.app).encode_message(
        task.serializer, args, kwargs, kept
    )
    return body, content_type, encoding, kept.get("queue")


def retrying(task: Task[Any, Any], task_id: str) -> Any:
    """The attempt running in this process whose retry ``task_id``'s publish is (its run
    is handed to the retry message instead of a new run recorded), else ``None``."""
    state = attempt_state(task)
    retry_of = state.attempt if state is not None and state.retrying else None
    if retry_of is not None and retry_of.lease.task_id == task_id:
        return retry_of
    return None


def publishing_attempt() -> Any:
    """The ledger's attempt whose body publishes now (its row rides out a database cut
    as the body's other writes do), else ``None``."""
    parent = get_current_worker_task()
    running = attempt_state(parent) if parent is not None else None
    return running.attempt if running is not None else None


def new_run(
    task: Task[Any, Any],
    task_id: str,
    call: dict[str, Any],
    stamp: Stamp,
    available_at: datetime | None,
    *,
    retries: int,
    message: tuple[bytes, str, str],
    queue: object,
) -> NewRun:
    """The row of a new run, as a plain value: its deadlines (``stamp``), its place in
    the workflow (the running task's, or the call's ``parent_id`` and ``root_id``), its
    message (:func:`message_of`) and occurrence."""
    parent = get_current_worker_task()
    parent_id = call.get("parent_id") or (parent.request.id if parent else None)
    root_id = call.get("root_id") or (
        (parent.request.root_id or parent.request.id) if parent else None
    )
    body, content_type, encoding = message
    return NewRun(
        task_id=task_id,
        task_name=task.name,
        deadline=stamp.governed.deadline,
        delivery_deadline=stamp.delivery,
        delivery_task=getattr(task, "deadline_kind", None) == "delivery",
        queue=_queue_name(queue),
        root_id=root_id or task_id,
        parent_id=parent_id or "",
        retries=retries,
        available_at=available_at,
        message_body=body,
        content_type=content_type,
        content_encoding=encoding,
        **wire.decode_occurrence((call.get("headers") or {}).get(wire.OCCURRENCE_HEADER)),
    )


def hand_to_eager_retry(task: Task[Any, Any], attempt: Any, retry: object) -> None:
    """An eager retry publishes nothing (``apply()`` runs ``retry.sig`` in place): hand
    the run to it here, as :func:`publish` does for a worker's retry message, so that
    its claim finds the run RETRYING (``attempt``: the eager run's, with the ledger on)."""
    if attempt is None or not isinstance(retry, Retry) or not getattr(retry, "is_eager", False):
        return
    sig = getattr(retry, "sig", None)
    if sig is None:
        return
    api = ledger.api_for(task.app)
    body, _, _ = api.encode_message(task.serializer, sig.args, sig.kwargs, {})
    api.hand_to_retry(
        attempt, retries=task.request.retries + 1, available_at=None, message_body=body
    )
    hit("retry.published", attempt.lease.task_id)  # nothing to send: apply() runs it


def run_of_request(
    app: Any, task_name: str, serializer: str, request: Any, deadline: datetime | None
) -> NewRun:
    """The row of a run whose message was published without the outbox, rebuilt from
    the request being executed (so the sweeper can republish it; its message encoded
    with the task's ``serializer``). A ``root_id`` or ``parent_id`` that is not a task
    id is not kept (:func:`envelope.link`)."""
    api = ledger.api_for(app)

    kept = {
        "link": request.callbacks,
        "link_error": request.errbacks,
        "chain": request.chain,
        "chord": request.chord,
        "group_id": request.group,
        "group_index": request.group_index,
        "root_id": envelope.link(request.root_id),
        "parent_id": envelope.link(request.parent_id),
        "headers": {
            key: value
            for key, value in headers_of(request).items()
            if key.startswith("x_deadline") or key == "expires"
        }
        or None,
        **{
            key: value
            for key, value in (request.delivery_info or {}).items()
            if key in ("exchange", "routing_key", "priority") and value
        },
    }
    kept = {key: value for key, value in kept.items() if value is not None}
    body, content_type, encoding = api.encode_message(
        serializer, request.args, request.kwargs, kept
    )
    return NewRun(
        task_id=request.id,
        task_name=task_name,
        deadline=deadline,
        delivery_deadline=None,
        root_id=envelope.link(request.root_id) or request.id,
        parent_id=envelope.link(request.parent_id) or "",
        retries=int(request.retries or 0),  # well-formed: the worker's main process held it
        available_at=None,
        message_body=body,
        content_type=content_type,
        content_encoding=encoding,
    )


#: Reasons of a refusal for the deadline: the ledger confirms them by its own clock.
_DEADLINE_REASONS = frozenset(
    {gates.Reason.DEADLINE_PASSED, gates.Reason.INSUFFICIENT_BUDGET, gates.Reason.DELIVERY_EXPIRED}
)


def record_refusal(
    app: Any,
    decision: gates.Decision,
    *,
    task_name: str,
    task_id: str,
    retries: int,
    reserve: timedelta | None,
) -> Refusal:
    """Record a gate's refusal in the ledger: what it did to the run, true when it ended
    it (only then may the refusal be stored as the task's result). A refusal for the
    deadline is confirmed by the ledger's clock against the task's ``reserve``, which
    such a refusal must give (``None``: a refusal for anything else)."""
    refusal = decision.refusal()
    return ledger.api_for(app).refuse_run(
        app,
        task_id=task_id,
        task_name=task_name,
        retries=retries,
        status=Status.EXPIRED,
        reason=refusal.reason,
        detail=str(refusal),
        deadline=decision.deadline,
        confirm_within=reserve if refusal.reason in _DEADLINE_REASONS else None,
    )


def record_refused_publish(
    app: Any, decision: gates.Decision, *, task_name: str, task_id: str
) -> bool:
    """Record the enqueue gate's refusal of a publish: its run ended, never published
    (:func:`~celery_deadlines.ledger.api.refuse_publish`); ``False`` when a run is
    recorded under the id already, which stands as it is."""
    refusal = decision.refusal()
    return ledger.api_for(app).refuse_publish(
        app,
        task_id=task_id,
        task_name=task_name,
        reason=refusal.reason,
        detail=str(refusal),
        deadline=decision.deadline,
    )


def _queue_name(queue: object) -> str | None:
    """A queue option's name (Celery takes a name or a kombu ``Queue``)."""
    if queue is None:
        return None
    name = getattr(queue, "name", queue)
    return str(name)[:255] if name else None
