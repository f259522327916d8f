"""The outbox: a run's row exists before its message, and can be published again.

``DeadlineTask.apply_async`` records the run (status QUEUED) and the message it is
about to publish, then publishes it: at once outside a transaction, or when the
caller's transaction commits (``transaction.on_commit``), so a rolled-back request
never starts work and a committed one never loses it. A publish that fails after the
commit leaves the run QUEUED; the reconciler's sweeper publishes it again once
``deadlines_republish_after`` has passed, and expires it (``deadline_passed``) if
its deadline passes first. A duplicate message is harmless: claiming is a
compare-and-swap.

The message is kept encoded with the task's own serializer, so whatever Celery could
publish the outbox can publish again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from celery import Celery
from django.db import connections, transaction
from kombu.serialization import dumps, loads

from .._crashpoints import hit
from ..errors import RunConflict
from .sql.connection import Store
from .sql.rows import ExistingRun, NewRun, Unclaimed

logger = logging.getLogger("celery_deadlines")

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


def decode_message(body: bytes, content_type: str, encoding: str) -> dict[str, Any]:
    message: dict[str, Any] = loads(body, content_type, encoding, accept={content_type})
    return message


def check_repeat(existing: ExistingRun | None, run: NewRun) -> None:
    """A publish under a task id the ledger already has: the same task with the same
    arguments is the same run (nothing is sent again); anything else raises
    :class:`RunConflict`."""
    if existing is None:  # gone meanwhile (purged): nothing to compare, nothing to send
        return
    why = ""
    if existing.task_name != run.task_name:
        why = f"the id was first used for {existing.task_name}, now for {run.task_name}"
    elif existing.message_body is not None and run.message_body is not None:
        before = decode_message(
            existing.message_body, existing.content_type, existing.content_encoding
        )
        now = decode_message(run.message_body, run.content_type, run.content_encoding)
        if (before.get("args"), before.get("kwargs")) != (now.get("args"), now.get("kwargs")):
            why = (
                f"it was published with args {before.get('args')!r} kwargs "
                f"{before.get('kwargs')!r}, now with args {now.get('args')!r} kwargs "
                f"{now.get('kwargs')!r}"
            )
    if why:
        raise RunConflict(run.task_id, existing.task_name, existing.status, why)


def record(store: Store, run: NewRun, publish: Callable[[], Any]) -> Any:
    """Record ``run``, then ``publish`` (now, or when the caller's transaction commits).

    Outside a transaction a failed publish ends the run with reason ``publish_failed``
    and the error reaches the caller, who knows nothing was sent. Inside one, the
    publish happens after the commit, when the caller can no longer be told: a failure
    is logged and the sweeper publishes the run again. A run id the ledger already has
    is checked by :func:`check_repeat` and nothing is published (``None``), unless its
    run ended ``publish_failed``: the caller was told and tries again, and the run is
    recorded and published again.
    """
    connection = connections[store.using]
    if not store.outbox.enqueue(run):
        existing = store.outbox.existing(run.task_id)
        check_repeat(existing, run)
        # The caller tries again after a publish that raised (it was told nothing was
        # sent): the run is recorded again and published (the nemesis soak, RabbitMQ
        # seed 7: the repeat returned as if sent, and the run stayed FAILED unsent).
        if not store.outbox.reopen_unpublished(run):
            logger.info(
                "%s[%s] published again under the same id and arguments: the existing run "
                "(%s) stands, nothing is sent",
                run.task_name,
                run.task_id,
                existing.status if existing is not None else "purged",
            )
            return None  # the same run published again: its result, nothing sent twice
    if not connection.in_atomic_block:
        hit("outbox.recorded", run.task_id)
        try:
            sent = publish()
        except Exception as exc:
            store.outbox.publish_failed(run.task_id, f"publish raised {exc!r}")
            raise
        hit("outbox.published", run.task_id)
        return sent

    def publish_after_commit() -> None:
        hit("outbox.recorded", run.task_id)
        try:
            publish()
            hit("outbox.published", run.task_id)
        except Exception:
            logger.exception(
                "publishing %s[%s] after commit failed; the outbox sweeper will publish it again",
                run.task_name,
                run.task_id,
            )

    transaction.on_commit(publish_after_commit, using=store.using)
    return None


def republish(app: Celery, message: Unclaimed) -> None:
    """Publish a recorded run's message again, with the run's current retry number.

    The deadline headers are the ones first published (a deadline never grows); no
    ``eta`` is set, since only runs whose ``available_at`` has passed are republished.
    """
    if message.message_body is None:
        raise ValueError(f"run {message.task_id} has no recorded message")
    decoded = decode_message(message.message_body, message.content_type, message.content_encoding)
    options: dict[str, Any] = dict(decoded.get("options") or {})
    app.send_task(
        message.task_name,
        decoded.get("args"),
        decoded.get("kwargs"),
        task_id=message.task_id,
        retries=message.retries,
        **options,
    )


def republish_run(app: Celery, store: Store, run_id: int) -> None:
    """Publish the recorded message of run ``run_id`` again (after a requeue)."""
    message = store.sweeps.message_of(run_id)
    if message is not None:
        republish(app, message)
