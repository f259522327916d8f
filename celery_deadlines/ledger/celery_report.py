"""What Celery's own tools are told of a run the ledger ends: its result and its event.

A worker that ends a task stores the outcome with the task's request (with
``result_extended``: name, args, kwargs, worker, retries, queue; django-celery-results
also reads ``argsrepr``, ``kwargsrepr`` and ``periodic_task_name``), fails the chain, the
chord and the errbacks that wait on it, and sends a task event: Flower and
django-celery-results show what those say. The ledger ends runs no worker is running
(the sweeper, the reconciler, an operator), so it does the same: :func:`request_for`
rebuilds the request from the run's recorded message, and :func:`tell_failed`,
:func:`tell_unknown` and :func:`tell_succeeded` store and announce with it.

Two rules hold every telling:

* a final state the result backend already holds (``SUCCESS``, ``FAILURE``,
  ``REVOKED``: a worker's, or Celery's own revoke or expiry) is never replaced: it is
  what the caller was told, and the ledger records that end instead of another;
* the event is the one a worker would send: ``task-succeeded`` for a success,
  ``task-failed`` for a run ended failed or
  expired (``task-revoked`` for one told as Celery's own expiry: its deadline was its
  ``expires``), ``task-unknown`` for a run that waits for an effect's outcome (Flower shows
  the state ``UNKNOWN``, as the result backend does, until a later event replaces it).
  In a worker it is sent when the worker sends task events (``-E``, or
  ``worker_send_task_events``, or Flower's *enable events*); in another process (the
  admin) when ``worker_send_task_events`` is set.

Everything here is logged, never raised: the ledger holds the outcome whatever the
result backend or the broker say.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from celery import states as celery_states
from celery.app.task import Context
from celery.backends.base import BaseKeyValueStoreBackend
from celery.utils.saferepr import saferepr

from ..errors import DeadlineRefused
from ..rules.outcomes import CELERY_EXPIRED, celery_revocation, unknown_meta
from ..rules.stamping import header_source
from ..rules.states import CALLER_UNKNOWN, UNKNOWN_EVENT
from . import outbox, results
from .sql.connection import Store
from .sql.rows import EndedRun, Recorded

logger = logging.getLogger("celery_deadlines")

#: The recorded options a worker's request carries as these fields.
_REQUEST_OPTIONS: Final = {
    "group_id": "group",
    "group_index": "group_index",
    "chord": "chord",
    "chain": "chain",
    "link": "callbacks",
    "link_error": "errbacks",
}


class _Worker:
    """The worker this process is (set by the ledger's ``worker_ready`` receiver): its
    name, and its event dispatcher, which says whether it sends task events now."""

    def __init__(self, hostname: str | None, dispatcher: Any) -> None:
        self.hostname = hostname
        self.dispatcher = dispatcher


_worker: _Worker | None = None


def attach(consumer: Any) -> None:
    """This process is the worker ``consumer`` runs: tell as it (its hostname, its events)."""
    global _worker
    _worker = _Worker(
        getattr(consumer, "hostname", None), getattr(consumer, "event_dispatcher", None)
    )


def detach() -> None:
    global _worker
    _worker = None


def events_on(app: Any) -> bool:
    """Whether a task event would be sent here now (see the module's docstring)."""
    worker = _worker
    if worker is None:
        return bool(app.conf.worker_send_task_events)
    dispatcher = worker.dispatcher
    if dispatcher is None or not dispatcher.enabled:
        return False
    groups = dispatcher.groups
    return not groups or "task" in groups


def request_for(app: Any, store: Store, task_id: str, task_name: str | None = None) -> Context:
    """The request a worker would have had for the run ``task_id`` (of ``task_name``, or
    the recorded one's), from its recorded message; the name, the id and this worker's
    hostname alone when none is recorded or its message is not one a worker here would
    decode (a stored row is never trusted further than that:
    :func:`~.outbox.readable_by_workers`)."""
    fields: dict[str, Any] = {
        "id": task_id,
        "task": task_name,
        "hostname": _worker.hostname if _worker is not None else None,
    }
    try:
        recorded = store.sweeps.recorded(task_id)
    except Exception:  # the result is stored with what is known
        logger.exception("reading the recorded message of run %s failed", task_id)
        recorded = None
    if recorded is not None:
        fields.update(_recorded_fields(app, recorded))
        if task_name is not None:
            fields["task"] = task_name
    return Context(fields)


def _recorded_fields(app: Any, recorded: Recorded) -> dict[str, Any]:
    message = recorded.message
    fields: dict[str, Any] = {
        "task": message.task_name,
        "retries": message.retries,
        "root_id": recorded.root_id,
    }
    queue = recorded.queue
    try:
        if message.message_body is None:
            raise outbox.UnreadableMessage("no recorded message")
        decoded = outbox.decode_message(
            message.message_body,
            message.content_type,
            message.content_encoding,
            accept=outbox.readable_by_workers(app, message.task_name),
        )
    except outbox.UnreadableMessage:
        decoded = None
    if decoded is not None:
        args, kwargs = list(decoded.get("args") or ()), dict(decoded.get("kwargs") or {})
        amqp = app.amqp
        depth = app.conf.get("task_repr_maxlevels") or 3  # a setting since Celery 5.6
        fields.update(
            args=args,
            kwargs=kwargs,
            argsrepr=saferepr(tuple(args), amqp.argsrepr_maxsize, maxlevels=depth),
            kwargsrepr=saferepr(kwargs, amqp.kwargsrepr_maxsize, maxlevels=depth),
        )
        options = decoded.get("options") or {}
        for option, field in _REQUEST_OPTIONS.items():
            if options.get(option) is not None:
                fields[field] = options[option]
        headers = options.get("headers")
        if isinstance(headers, dict):
            fields["headers"] = headers  # a worker's request has its message's headers
            if isinstance(headers.get("periodic_task_name"), str):
                fields["periodic_task_name"] = headers["periodic_task_name"]
        queue = queue or _name(options.get("queue"))
    if queue:
        fields["delivery_info"] = {"routing_key": queue}
    return fields


def _name(queue: object) -> str | None:
    name = getattr(queue, "name", queue)
    return name if isinstance(name, str) and name else None


def untold(app: Any, task_ids: list[str]) -> list[str]:
    """Those of ``task_ids`` whose result holds no final state (as :func:`already_told`
    says of each), read in one round trip where the result backend is a key-value store
    (Redis, memcached: ``mget``) or keeps its results as rows of a model
    (django-celery-results), one by one elsewhere."""
    final = _states_at_once(app.backend, task_ids)
    if final is None:
        return [task_id for task_id in task_ids if already_told(app, task_id) is None]
    return [
        t
        for t, state in zip(task_ids, final, strict=True)
        if state not in celery_states.READY_STATES
    ]


def _states_at_once(backend: Any, task_ids: list[str]) -> list[str | None] | None:
    """The state each of ``task_ids``'s results holds (``None``: none stored), by one
    ``mget`` or one query; ``None`` where the backend has neither, or its answer does not
    read."""
    if not task_ids:
        return None
    rows = getattr(backend, "TaskModel", None)  # django-celery-results' results
    if rows is not None:
        try:
            found = rows._default_manager.filter(task_id__in=task_ids)
            states = dict(found.values_list("task_id", "status"))
        except Exception:  # asked one by one instead
            logger.debug("reading %d results at once failed", len(task_ids), exc_info=True)
            return None
        return [states.get(task_id) for task_id in task_ids]
    if not isinstance(backend, BaseKeyValueStoreBackend):
        return None
    keys = [backend.get_key_for_task(task_id) for task_id in task_ids]
    try:
        values = backend.mget(keys)
        if isinstance(values, dict):  # memcached's answer, by key
            values = [values.get(key) for key in keys]
        return [None if v is None else backend.decode_result(v).get("status") for v in values]
    except Exception:  # asked one by one instead
        logger.debug("reading %d results at once failed", len(task_ids), exc_info=True)
        return None


def already_told(app: Any, task_id: str) -> str | None:
    """The final state the run's result already holds, if any (``None`` when it holds
    none, or the backend cannot say: then the ledger's outcome is stored)."""
    try:
        state = app.backend.get_task_meta(task_id, cache=False).get("status")
    except Exception:  # noqa: BLE001 - a disabled or unreachable backend stores nothing anyway
        return None
    return state if state in celery_states.READY_STATES else None


def stores_errors(app: Any, task_name: str) -> bool:
    """Celery's rule: a task's errors are stored unless it ignores its results, and then
    only with ``store_errors_even_if_ignored`` (an unknown task's are)."""
    task = app.tasks.get(task_name)
    return task is None or bool(task.store_errors_even_if_ignored or not task.ignore_result)


def tell_failed(app: Any, store: Store, task_id: str, task_name: str, error: Exception) -> bool:
    """Store ``error`` as the run's failure with the request a worker would have had
    (its chain, chord and errbacks are failed as a worker fails them) and send
    ``task-failed``; ``False`` (nothing stored or sent) when the result already holds a
    final state. A refusal for the deadline of a run whose recorded message's deadline
    is Celery's ``expires`` is told as Celery tells that expiry instead
    (:func:`~celery_deadlines.rules.outcomes.told_as_celery_expiry`): ``REVOKED``,
    ``TaskRevokedError('expired')``, ``task-revoked`` with ``expired=True``; a cancelled
    run's as Celery's revoke (``TaskRevokedError('revoked')``)."""
    told = already_told(app, task_id)
    if told is not None:
        logger.info(
            "%s[%s]: the result already says %s; the ledger's end (%r) is not stored over it",
            task_name,
            task_id,
            told,
            error,
        )
        return False
    request = request_for(app, store, task_id, task_name)
    stores = stores_errors(app, task_name)
    revoked_as = (
        celery_revocation(error.reason, header_source(request.headers or {}))
        if isinstance(error, DeadlineRefused)
        else None
    )
    try:
        if revoked_as is not None:
            app.backend.mark_as_revoked(task_id, revoked_as, request=request, store_result=stores)
        else:
            app.backend.mark_as_failure(task_id, error, request=request, store_result=stores)
    except Exception:  # the ledger holds the outcome
        logger.exception("storing the end of run %s in the result backend failed", task_id)
    if revoked_as is not None:
        send_event(
            app,
            "task-revoked",
            task_id,
            terminated=False,
            signum=None,
            expired=revoked_as == CELERY_EXPIRED,
        )
    else:
        send_event(app, "task-failed", task_id, exception=repr(error), traceback="")
    return True


def tell_succeeded(app: Any, store: Store, run: EndedRun) -> bool:
    """Store the return value a SUCCEEDED run's completion kept as its result, with the
    request a worker would have had, and send ``task-succeeded``; ``False`` (nothing
    stored or sent) when the result already holds a final state, or when no value was
    kept or the kept one is not read here (the log says why).

    The request carries no chord: only the worker that ran a chord's part counts it, as
    a part counted twice (a worker that stalled past the grace, then stored it too)
    would run the chord's callback before its last part."""
    if run.result is None or already_told(app, run.task_id) is not None:
        return False
    try:
        value = results.read(app, run.result)
    except outbox.UnreadableMessage as unreadable:
        logger.warning(
            "%s[%s]: the run SUCCEEDED and its caller has no result; its kept return value "
            "is not read here: %s",
            run.task_name,
            run.task_id,
            unreadable,
        )
        return False
    request = request_for(app, store, run.task_id, run.task_name)
    request.chord = None
    try:
        app.backend.mark_as_done(run.task_id, value, request=request)
    except Exception:  # the ledger holds the outcome
        logger.exception("storing the success of run %s in the result backend failed", run.task_id)
        return False
    send_event(app, "task-succeeded", run.task_id, result=saferepr(value), runtime=None)
    return True


def tell_unknown(app: Any, store: Store, run_id: int, task_id: str, error: str) -> None:
    """The caller's result and Flower show the run as ``UNKNOWN`` (naming the effects
    whose outcome is unknown) until the settled outcome replaces it."""
    if already_told(app, task_id) is not None:
        return
    keys = store.effects.unresolved_keys(run_id)
    request = request_for(app, store, task_id)
    try:
        app.backend.store_result(
            task_id, unknown_meta(keys, error), CALLER_UNKNOWN, request=request
        )
    except Exception:  # the ledger holds the truth; the caller keeps its last state
        logger.exception("storing the UNKNOWN state of run %s failed", task_id)
    send_event(app, UNKNOWN_EVENT, task_id, effects=list(keys), detail=error)


def send_event(app: Any, kind: str, task_id: str, **fields: Any) -> None:
    """Send the task event ``kind`` for ``task_id`` as this worker (or process), if task
    events are on here (:func:`events_on`)."""
    if not events_on(app):
        return
    hostname = _worker.hostname if _worker is not None else None
    try:
        with app.events.default_dispatcher(hostname=hostname) as dispatcher:
            dispatcher.send(kind, uuid=task_id, **fields)
    except Exception:  # an event is a courtesy to the monitors: never the run's outcome
        logger.exception("sending %s for run %s failed", kind, task_id)
