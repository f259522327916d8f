"""Waiting out a database the ledger cannot reach: a statement tried again every
:data:`RETRY_INTERVAL` until a span of (monotonic) time has passed.

The claim waits up to one lease before it hands its message back; an attempt's last
write waits longer, since its body has already run (``ledger.api``, ``ledger.attempt``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from django.db import InterfaceError, OperationalError

from .. import clock

#: Seconds between two tries at an unreachable database.
RETRY_INTERVAL = 0.2
#: A lost or refused connection, not a wrong statement: the errors worth trying again.
CONNECTION_ERRORS = (OperationalError, InterfaceError)

_T = TypeVar("_T")


class Patience:
    """A span of time, from now (or from ``started``, a monotonic reading taken before
    a first try made without one), during which the database is tried again;
    ``until``, a monotonic reading (the run's deadline), ends it sooner if it comes
    first."""

    def __init__(
        self, span: timedelta, until: float | None = None, *, started: float | None = None
    ) -> None:
        self.started = clock.monotonic() if started is None else started
        self.give_up = self.started + span.total_seconds()
        #: whether ``until`` ends the span (the deadline comes before it would)
        self.cut_short = until is not None and until < self.give_up
        if until is not None:
            self.give_up = min(self.give_up, until)

    def waited(self) -> float:
        """Seconds since the first try."""
        return clock.monotonic() - self.started

    def spent(self) -> bool:
        return clock.monotonic() >= self.give_up

    def pause(self) -> None:
        threading.Event().wait(RETRY_INTERVAL)

    def reach(
        self,
        statement: Callable[[], _T],
        errors: tuple[type[Exception], ...] = CONNECTION_ERRORS,
    ) -> _T:
        """``statement()``, tried again while it raises one of ``errors``; once the span
        has passed, that error is raised."""
        while True:
            try:
                return statement()
            except errors:
                if self.spent():
                    raise
            self.pause()
