"""The outbox: a run's row exists before its message, and can be published again.

``DeadlineTask.apply_async`` records the run (status QUEUED) and the message it is
about to publish (:func:`record`), then publishes it: at once outside a transaction, or
when the caller's transaction commits (``transaction.on_commit``: :func:`at_commit`),
so a rolled-back request never starts work and a committed one never loses it: the
outbox says which (:class:`~celery_deadlines.rules.records.Recorded`), the Celery tier
sends. A publish that fails after the commit leaves the run QUEUED; the reconciler's
sweeper publishes it again once ``deadlines_republish_after`` has passed, and expires
it (``deadline_passed``) if its deadline passes first. A duplicate message is
harmless: claiming is a compare-and-swap.

The message is kept encoded with the task's own serializer, so whatever Celery could
publish the outbox can publish again. A stored row is read as if an attacker wrote it:
it is decoded only with a content type the app's workers accept (``accept_content``)
and, when the task is known here, only with the one its serializer writes
(:func:`readable_by_workers`); the admin, a web process, decodes no serializer that
can run code (:data:`DATA_ONLY`). What cannot be decoded is :class:`UnreadableMessage`:
the sweeper ends its run ``FAILED`` (``message_unreadable``), the admin says why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any, Final

from celery import Celery
from django.db import connections, transaction
from kombu import serialization
from kombu.serialization import dumps, loads, prepare_accept_content

from ..errors import RunConflict
from ..rules.records import Recorded
from .sql.connection import Store
from .sql.rows import ExistingRun, NewRun, Unclaimed

logger = logging.getLogger("celery_deadlines")

#: kombu's serializers by name and content type (kombu-stubs do not declare it).
_registry: Any = getattr(serialization, "registry")  # noqa: B009

#: apply_async options that are not part of the message (or are kept elsewhere).
_NOT_KEPT: Final = frozenset(
    {
        "producer",
        "connection",
        "router",
        "publisher",
        "result_cls",
        "task_type",
        "countdown",
        "eta",
        "retries",
        "task_id",
        "add_to_parent",
    }
)


def encode_message(
    serializer: str, args: Any, kwargs: Any, options: dict[str, Any]
) -> tuple[bytes, str, str]:
    """The message to keep, encoded like Celery would: (body, content type, encoding)."""
    kept = {key: value for key, value in options.items() if key not in _NOT_KEPT}
    content_type, encoding, body = dumps(
        {"args": list(args or ()), "kwargs": dict(kwargs or {}), "options": kept},
        serializer=serializer,
    )
    raw = body.encode(encoding) if isinstance(body, str) else bytes(body)
    return raw, content_type, encoding


#: The serializers that only ever build data, the only ones the admin decodes to show a
#: message (kombu's yaml reads with ``safe_load``); pickle runs code as it reads.
DATA_ONLY: Final = frozenset({"application/json", "application/x-msgpack", "application/x-yaml"})

#: How much of a stored content type an explanation repeats (the column is the writer's).
_SHOWN: Final = 80


class UnreadableMessage(ValueError):
    """A recorded message this process will not or cannot decode: its content type is
    not one it accepts, or its body is not what the content type says."""


def content_type_of(serializer: str) -> str | None:
    """The content type ``serializer`` (a name, or a content type already) writes."""
    return serializer if "/" in serializer else _registry.name_to_type.get(serializer)


def accepted_content(app: Celery, accept: Any = None) -> frozenset[str]:
    """The content types the app accepts (``accept``, else ``accept_content``, as kombu
    names them; unset, kombu accepts every registered serializer)."""
    try:
        accepted = prepare_accept_content(app.conf.accept_content if accept is None else accept)
    except Exception:  # noqa: BLE001 (a serializer named but not installed: none of it)
        return frozenset()
    return frozenset(_registry.type_to_name if accepted is None else accepted)


def readable_by_workers(app: Celery, task_name: str) -> frozenset[str]:
    """What a worker decodes a run's recorded message with: the content type the outbox
    wrote it in (the task's serializer; the app's ``task_serializer`` for a task not
    registered here), if the app accepts it. Never what the row itself names."""
    task = app.tasks.get(task_name)
    written = content_type_of(str(getattr(task, "serializer", None) or app.conf.task_serializer))
    return accepted_content(app) & {written} if written else frozenset()


def readable_for_display(app: Celery) -> frozenset[str]:
    """What the admin decodes to show a message: data-only serializers the app accepts."""
    return accepted_content(app) & DATA_ONLY


def decode_message(
    body: bytes, content_type: str, encoding: str, *, accept: Collection[str]
) -> dict[str, Any]:
    """The recorded message (``args``, ``kwargs``, ``options``), decoded only if its
    content type is one of ``accept``; raises :class:`UnreadableMessage` otherwise, or
    when the body does not decode to a message of that shape."""
    shown = repr(content_type[:_SHOWN]) + ("..." if len(content_type) > _SHOWN else "")
    if content_type not in accept:
        allowed = ", ".join(sorted(accept)) or "none"
        raise UnreadableMessage(
            f"stored as {shown}, which is not decoded here (decoded here: {allowed})"
        )
    try:
        message = loads(body, content_type, encoding, accept=accept)
    except Exception as exc:
        raise UnreadableMessage(
            f"stored as {shown}, {len(body)} bytes that do not decode ({type(exc).__name__})"
        ) from exc
    if not (
        isinstance(message, dict)
        and isinstance(message.get("args", []), (list, tuple))
        and isinstance(message.get("kwargs", {}), dict)
        and isinstance(message.get("options", {}), dict)
    ):
        raise UnreadableMessage(
            f"stored as {shown}, {len(body)} bytes that decode to no message "
            "(a mapping of args, kwargs and options)"
        )
    return message


def check_repeat(existing: ExistingRun | None, run: NewRun, *, accept: Collection[str]) -> None:
    """A publish under a task id the ledger already has: the same task with the same
    arguments is the same run (nothing is sent again); anything else raises
    :class:`RunConflict`, and so does a recorded message not decodable with ``accept``
    (nothing shows it is the same run)."""
    if existing is None:  # gone meanwhile (purged): nothing to compare, nothing to send
        return
    why = ""
    if existing.task_name != run.task_name:
        why = f"the id was first used for {existing.task_name}, now for {run.task_name}"
    elif existing.message_body is not None and run.message_body is not None:
        try:
            before = decode_message(
                existing.message_body,
                existing.content_type,
                existing.content_encoding,
                accept=accept,
            )
        except UnreadableMessage as exc:
            raise RunConflict(
                run.task_id,
                existing.task_name,
                existing.status,
                f"its recorded message cannot be compared: {exc}",
            ) from None
        # the message this process has just encoded itself
        now = decode_message(
            run.message_body, run.content_type, run.content_encoding, accept={run.content_type}
        )
        if (before.get("args"), before.get("kwargs")) != (now.get("args"), now.get("kwargs")):
            why = (
                f"it was published with args {before.get('args')!r} kwargs "
                f"{before.get('kwargs')!r}, now with args {now.get('args')!r} kwargs "
                f"{now.get('kwargs')!r}"
            )
    if why:
        raise RunConflict(run.task_id, existing.task_name, existing.status, why)


def record(store: Store, run: NewRun, *, accept: Collection[str]) -> Recorded:
    """Record ``run``, and say when its message is sent (:class:`Recorded`): now, outside
    a transaction; when the caller's transaction commits, inside one (a rolled-back
    request never starts work, a committed one never loses it). A run id the ledger
    already has is checked by :func:`check_repeat` (its recorded message decoded only
    with ``accept``) and nothing is sent (``ALREADY``), unless its run ended
    ``publish_failed``: the caller was told and tries again, and the run is recorded
    and sent again.
    """
    if not store.outbox.enqueue(run):
        existing = store.outbox.existing(run.task_id)
        check_repeat(existing, run, accept=accept)
        # The caller tries again after a publish that raised (it was told nothing was
        # sent): the run is recorded again and published, never answered "already sent".
        if not store.outbox.reopen_unpublished(run):
            logger.info(
                "%s[%s] published again under the same id and arguments: the existing run "
                "(%s) stands, nothing is sent",
                run.task_name,
                run.task_id,
                existing.status if existing is not None else "purged",
            )
            return Recorded.ALREADY  # the same run published again: nothing sent twice
    if connections[store.using].in_atomic_block:
        return Recorded.AT_COMMIT
    return Recorded.NOW


def publish_failed(store: Store, task_id: str, error: BaseException) -> None:
    """The send of a run recorded outside a transaction raised ``error``: the run ends
    ``publish_failed`` (the caller, told by the error, knows nothing was sent)."""
    store.outbox.publish_failed(task_id, f"publish raised {error!r}")


def at_commit(store: Store, send: Callable[[], None]) -> None:
    """Send a run recorded in the caller's transaction once that commits (Django's
    ``on_commit``: the one hook that runs at a commit takes a function)."""
    transaction.on_commit(send, using=store.using)


def republish(app: Celery, message: Unclaimed) -> None:
    """Publish a recorded run's message again, with the run's current retry number.

    The deadline headers are the ones first published (a deadline never grows); no
    ``eta`` is set, since only runs whose ``available_at`` has passed are republished.
    Raises :class:`UnreadableMessage` for a message a worker would not decode
    (:func:`readable_by_workers`): nothing is published.
    """
    if message.message_body is None:
        raise UnreadableMessage(f"run {message.task_id} has no recorded message")
    decoded = decode_message(
        message.message_body,
        message.content_type,
        message.content_encoding,
        accept=readable_by_workers(app, message.task_name),
    )
    # what the outbox never keeps is never taken from a row (it would clash with the
    # arguments below, or set what the run's columns own)
    options = {
        key: value
        for key, value in decoded.get("options", {}).items()
        if isinstance(key, str) and key not in _NOT_KEPT
    }
    app.send_task(
        message.task_name,
        decoded.get("args"),
        decoded.get("kwargs"),
        task_id=message.task_id,
        retries=message.retries,
        **options,
    )
