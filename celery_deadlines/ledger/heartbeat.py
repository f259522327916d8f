"""Lease renewal while a body runs: one thread per worker process, capped by the deadline.

An attempt's lease is renewed a third of the way into each TTL, by the database clock
(``store.renew``), never past the run's deadline, and not at all once the deadline has
passed: a run that needs more time has to be a new decision, not an old authority
silently extended (docs/explanation/run-ledger.md, "Leases, renewal and the deadline"). A
renewal that affects no row means the lease is gone; the attempt is marked lost and its
next write raises :class:`StaleLease` at once. Timing uses the monotonic clock only: a
wall-clock jump neither hurries nor delays it.
"""

from __future__ import annotations

import logging
import math
import threading
from datetime import timedelta
from typing import TYPE_CHECKING

from django.db import connections

from ..clock import get_clock

if TYPE_CHECKING:
    from .attempt import Attempt
    from .sql.connection import Store

logger = logging.getLogger("celery_deadlines")

#: Renew when this fraction of the TTL has passed since the last renewal.
RENEW_AT: float = 1 / 3
#: After a failed renewal (database unreachable), try again this soon.
RETRY_AFTER = timedelta(seconds=1)


class Heartbeat:
    """Renews the leases of the attempts running in this process."""

    def __init__(self) -> None:
        self._due: dict[Attempt, float] = {}
        self._wakeup = threading.Condition()
        # held while a renewal is in flight, so forget() returns only once none is
        self._renewing = threading.Lock()
        self._thread: threading.Thread | None = None
        #: the monotonic instant the thread sleeps until (``inf``: until woken; ``-inf``:
        #: awake, it looks at ``_due`` before it sleeps again)
        self._asleep_until = -math.inf
        #: the stores the thread renewed leases on since it last had none to renew
        #: (written by the thread alone)
        self._used: set[Store] = set()

    def watch(self, attempt: Attempt) -> None:
        """Start renewing ``attempt``'s lease until :meth:`forget`.

        The thread is woken only if it would otherwise sleep past this attempt's first
        renewal: attempts of one TTL come due in the order they start, so a process
        running one task after another wakes it about once a renewal period, not once a
        task (each wake is a switch of threads and of the GIL)."""
        due = get_clock().monotonic() + attempt.ttl.total_seconds() * RENEW_AT
        with self._wakeup:
            self._due[attempt] = due
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="celery-deadlines-heartbeat", daemon=True
                )
                self._asleep_until = -math.inf
                self._thread.start()
            elif due < self._asleep_until:
                self._wakeup.notify()

    def forget(self, attempt: Attempt) -> None:
        """Stop renewing ``attempt``; returns after any renewal in flight has finished,
        so the attempt's final write is never followed by a renewal."""
        with self._renewing, self._wakeup:
            self._due.pop(attempt, None)
            if not self._due and self._used:
                self._wakeup.notify()  # to close its connections now (:meth:`_next_due`)

    def _run(self) -> None:
        try:
            while True:
                attempt = self._next_due()
                if attempt is not None:
                    self._renew(attempt)
        finally:  # pragma: no cover - a daemon thread dies with its process
            connections.close_all()

    def _next_due(self) -> Attempt | None:
        with self._wakeup:
            while True:
                if not self._due:
                    if self._used:
                        self._asleep_until = -math.inf
                        break  # its connections are closed first, outside the lock
                    self._asleep_until = math.inf
                    self._wakeup.wait()
                    continue
                attempt, due = min(self._due.items(), key=lambda item: item[1])
                wait = due - get_clock().monotonic()
                if wait <= 0:
                    self._asleep_until = -math.inf
                    return attempt
                self._asleep_until = due
                self._wakeup.wait(wait)
        self._close_idle()
        return None

    def _close_idle(self) -> None:
        """With no lease left to renew, close this thread's connection of each store it
        renewed on: none is held open between the attempts that outlive a renewal (an
        eager run's store among them, whose own thread closes its own when it ends)."""
        used, self._used = self._used, set()
        for store in used:
            store.close()

    def _renew(self, attempt: Attempt) -> None:
        with self._renewing:
            with self._wakeup:
                if attempt not in self._due:
                    return  # forgotten meanwhile
            self._renew_now(attempt)

    def _renew_now(self, attempt: Attempt) -> None:
        self._used.add(attempt.store)
        try:
            expires = attempt.renew()
        except Exception:  # a database hiccup must not kill the heartbeat
            logger.exception("renewing the lease of %s failed; trying again", attempt)
            self._reschedule(attempt, RETRY_AFTER.total_seconds())
            return
        if expires is None or (
            attempt.lease.deadline is not None and expires >= attempt.lease.deadline
        ):
            with self._wakeup:  # gone, or capped at the deadline: nothing left to renew
                self._due.pop(attempt, None)
            return
        self._reschedule(attempt, attempt.ttl.total_seconds() * RENEW_AT)

    def _reschedule(self, attempt: Attempt, seconds: float) -> None:
        with self._wakeup:
            if attempt in self._due:
                self._due[attempt] = get_clock().monotonic() + seconds


_heartbeat = Heartbeat()


def heartbeat() -> Heartbeat:
    """This process's heartbeat."""
    return _heartbeat
