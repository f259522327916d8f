"""The worker's clock against the ledger's: measured every reconcile pass, and while it
is beyond ``deadlines_clock_skew_budget`` the worker takes no new work
(docs/explanation/run-ledger.md, "The clock-skew budget").

Each check reads the database clock between two local wall-clock readings (a
:class:`~celery_deadlines.rules.skew.ClockReading`). When the error bound leaves the budget,
or the database cannot be read, the worker says so (a WARNING log and the
``clock_uncertain`` signal) and cancels its task queues, so no new message is
received; in-flight work keeps its lease and effect rules. When the reading is back
within the budget it says so (``clock_certain``) and consumes again. Queue changes run
on the consumer's event loop (``hub.call_soon``), never from this thread directly.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from ..clock import get_clock
from ..rules.skew import ClockReading, Readiness, describe, gate
from ..signals import clock_certain, clock_measured, clock_uncertain
from .sql.connection import Store

logger = logging.getLogger("celery_deadlines")


def measure(store: Store) -> tuple[ClockReading | None, tuple[datetime, float] | None]:
    """Read the ledger's clock once: the reading (``None``: it could not be read) and the
    ledger's time then with this process's monotonic clock at the same moment (the
    midpoint of the statement's round trip)."""
    try:
        authority = store.database_now()
        end = get_clock().monotonic()
        before, after = store.last_round_trip()  # the statement's own round trip
    except Exception:  # an unreachable authority is uncertainty, not permission
        logger.exception("reading the ledger's clock failed")
        return None, None
    midpoint = end - (after - before).total_seconds() / 2
    return ClockReading.between(before, authority, after), (authority, midpoint)


class ClockWatch:
    """One worker's view of its clock; :meth:`check` measures and acts on a change."""

    def __init__(self, store: Store, budget: timedelta, consumer: Any) -> None:
        self.store = store
        self.budget = budget
        self.consumer = consumer
        #: the last reading (``None``: the authority could not be read)
        self.reading: ClockReading | None = None
        self.uncertain = False
        self._paused: list[str] = []
        #: the ledger's time at the last good reading, and this process's monotonic
        #: clock then: the ledger's time now is estimated without the wall clock
        self._anchor: tuple[datetime, float] | None = None
        #: set by :meth:`suspect`; the reconciler re-measures at once
        self.on_suspect: Any = None

    def check(self) -> ClockReading | None:
        reading, anchor = measure(self.store)
        self.reading = reading
        uncertain = gate(get_clock().now(), reading, self.budget) is Readiness.CLOCK_UNCERTAIN
        self._anchor = None if uncertain else anchor
        clock_measured.send(sender=self, reading=reading)
        if uncertain != self.uncertain:
            self.uncertain = uncertain
            if uncertain:
                self._hold(reading)
            else:
                self._release(reading)
        return reading

    def authority_now(self) -> datetime | None:
        """The ledger's time now, from the last reading within the budget plus the
        monotonic time since (a wall-clock step since then changes nothing); ``None``
        while the clock is uncertain: the caller must not judge time by itself."""
        if self.uncertain or self._anchor is None:
            return None
        authority, monotonic = self._anchor
        return authority + timedelta(seconds=get_clock().monotonic() - monotonic)

    def suspect(self) -> None:
        """Someone saw this worker's wall clock disagree with :meth:`authority_now`:
        measure again now rather than at the next pass."""
        if self.on_suspect is not None:
            self.on_suspect()

    def _hold(self, reading: ClockReading | None) -> None:
        logger.warning(
            "clock uncertain: %s, beyond the skew budget of %s s; "
            "this worker takes no new work until its clock agrees again",
            describe(reading),
            self.budget.total_seconds(),
        )
        clock_uncertain.send(sender=self, reading=reading, budget=self.budget)
        self._on_loop(self._sync)

    def _release(self, reading: ClockReading | None) -> None:
        assert reading is not None
        logger.warning(
            "clock back within the skew budget: offset %+.3f s; consuming again",
            reading.offset.total_seconds(),
        )
        clock_certain.send(sender=self, reading=reading, budget=self.budget)
        self._on_loop(self._sync)

    def _on_loop(self, action: Any) -> None:
        hub = getattr(self.consumer, "hub", None)
        if hub is not None:
            hub.call_soon(action)  # thread-safe: kombu's hub wakes its loop for it
        else:
            action()

    def _sync(self) -> None:
        """Make the consumer match :attr:`uncertain` (idempotent, so callbacks that run
        late or out of order converge on the current state)."""
        task_consumer = getattr(self.consumer, "task_consumer", None)
        if task_consumer is None:
            return
        if self.uncertain:
            consuming = [queue.name for queue in task_consumer.queues]
            for name in consuming:
                if name not in self._paused:
                    self._paused.append(name)  # remembered once, never forgotten
                self.consumer.cancel_task_queue(name)
        else:
            queues = self.consumer.app.amqp.queues
            for name in self._paused:
                if name in queues:
                    queues.select_add(queues[name])  # also for a reconnect's rebuild
                self.consumer.add_task_queue(name)
            self._paused = []
