"""The outbox: a run's row exists before its message, and can be published again.

``DeadlineTask.apply_async`` records the run (status QUEUED) and the message it is
about to publish, then publishes it: at once outside a transaction, or when the
caller's transaction commits (``transaction.on_commit``), so a rolled-back request
never starts work and a committed one never loses it. A publish that fails after the
commit leaves the run QUEUED; the reconciler's sweeper publishes it again once
``deadlines_republish_after`` has passed, and expires it (``expired_before_claim``) if
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
from .sql.connection import Store
from .sql.rows import NewRun, Unclaimed

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


def record(store: Store, run: NewRun, publish: Callable[[], Any]) -> Any:
    """Record ``run``, then ``publish`` (now, or when the caller's transaction commits).

    Outside a transaction a failed publish ends the run with reason ``publish_failed``
    and the error reaches the caller, who knows nothing was sent. Inside one, the
    publish happens after the commit, when the caller can no longer be told: a failure
    is logged and the sweeper publishes the run again.
    """
    connection = connections[store.using]
    store.runs.enqueue(run)
    if not connection.in_atomic_block:
        hit("outbox.recorded", run.task_id)
        try:
            sent = publish()
        except Exception as exc:
            store.runs.publish_failed(run.task_id, f"publish raised {exc!r}")
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
