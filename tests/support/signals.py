"""Capture what one of the library's signals sent during a block (tests only)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery.utils.dispatch import Signal


@contextmanager
def received(signal: Signal) -> Iterator[list[dict[str, Any]]]:
    """The keyword arguments of every send of ``signal`` in the block, in order."""
    sent: list[dict[str, Any]] = []

    def receive(**kwargs: Any) -> None:
        sent.append(kwargs)

    signal.connect(receive, weak=False)
    try:
        yield sent
    finally:
        signal.disconnect(receive)
