"""A success's return value, kept with the run's completion write.

A worker that dies after the ledger recorded SUCCEEDED and before Celery stored the
result left its caller ``PENDING`` for good: the redelivered message's claim finds the
run ended and had nothing to tell. The completion write keeps the value, encoded with
the app's ``result_serializer`` (what the result backend writes with), when it is at
most :data:`RESULT_LIMIT` bytes; an ``ignore_result`` task keeps nothing. A kept value
is read as if an attacker wrote it: decoded only if it is at most :data:`RESULT_LIMIT`
bytes (a larger one, written by hand or by an older version, is read as none kept),
only with the content type that serializer writes, and only if the app accepts it for
results (``result_accept_content``, else ``accept_content``); otherwise
:class:`~.outbox.UnreadableMessage`.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from celery import Celery
from kombu.serialization import dumps, loads

from ..rules.records import KeptResult
from .outbox import UnreadableMessage, accepted_content, content_type_of

logger = logging.getLogger("celery_deadlines")

#: The largest encoded return value the ledger keeps (bytes): a larger one is left to the
#: result backend alone, as before (its caller may wait, as the docs say).
RESULT_LIMIT: Final = 64 * 1024


def keep(app: Celery, value: Any) -> KeptResult | None:
    """``value`` encoded to keep, or ``None`` (larger than :data:`RESULT_LIMIT`, or not
    encodable: Celery's own store then fails the run as it always did)."""
    try:
        content_type, encoding, body = dumps(value, serializer=app.conf.result_serializer)
    except Exception:  # Celery reports it when it stores the result
        logger.debug("a return value not encodable with the result serializer", exc_info=True)
        return None
    raw = body.encode(encoding) if isinstance(body, str) else bytes(body)
    if len(raw) > RESULT_LIMIT:
        return None
    return KeptResult(raw, content_type, encoding)


def result_content(app: Celery) -> frozenset[str]:
    """The one content type a kept value is decoded with: the result serializer's, if
    the app accepts it for results."""
    written = content_type_of(str(app.conf.result_serializer))
    accepted = accepted_content(app, app.conf.result_accept_content or app.conf.accept_content)
    return accepted & {written} if written else frozenset()


def read(app: Celery, kept: KeptResult) -> Any:
    """The kept return value, decoded (see the module); raises ``UnreadableMessage``.

    A value over :data:`RESULT_LIMIT` is never decoded nor handed on: its caller is told
    what it is told of a value too large to keep (nothing by the ledger: the log says
    why), never the whole of what the row holds."""
    if len(kept.body) > RESULT_LIMIT:
        raise UnreadableMessage(
            f"a return value of {len(kept.body)} bytes, over the {RESULT_LIMIT} the ledger "
            "keeps, is read as none kept"
        )
    accept = result_content(app)
    if kept.content_type not in accept:
        raise UnreadableMessage(
            f"a return value kept as {kept.content_type[:80]!r}, which is not decoded here"
        )
    try:
        return loads(kept.body, kept.content_type, kept.encoding, accept=accept)
    except Exception as exc:
        raise UnreadableMessage(
            f"a return value of {len(kept.body)} bytes that does not decode ({type(exc).__name__})"
        ) from exc
