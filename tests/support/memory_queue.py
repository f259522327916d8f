"""Read back what was published to kombu's in-memory transport (tests without a broker)."""

from __future__ import annotations

from typing import Any

from celery import Celery


def drain(app: Celery, queue_name: str) -> list[dict[str, Any]]:
    """Every message waiting in ``queue_name``, acknowledged: its headers and its body."""
    found = []
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue(queue_name)
        while True:
            try:
                message = queue.get(block=False)
            except queue.Empty:
                break
            found.append({"headers": message.headers, "body": message.decode()})
            message.ack()
        queue.close()
    return found
