"""Keeping the ledger bounded: purge ended runs older than the retention, in batches.

:func:`purge` is what ``manage.py deadlines purge`` runs; :class:`PeriodicPurge` is the
workers' share: each worker's reconciler (:mod:`.reconcile`) asks it after every pass,
and it purges at most once per :data:`~celery_deadlines.rules.retention.PURGE_INTERVAL`, at
most :data:`~celery_deadlines.rules.retention.MAX_BATCHES_PER_PASS` batches at a time, so a
pass never holds up the reconciler for long. Which runs may go is
:mod:`.sql.retention`'s rule; the cutoff is the database clock minus the retention,
read once per purge.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from .. import conf
from ..clock import get_clock
from ..conf import settings_for
from ..rules.retention import (
    BATCH_SIZE,
    MAX_BATCHES_PER_PASS,
    PURGE_INTERVAL,
    PurgeCounts,
    cutoff,
    describe_age,
    purge_due,
)
from .sql.connection import Store

logger = logging.getLogger("celery_deadlines")


def purge(
    store: Store,
    older_than: timedelta,
    *,
    batch_size: int = BATCH_SIZE,
    max_batches: int | None = None,
) -> tuple[datetime, PurgeCounts]:
    """Delete ended runs older than ``older_than`` (by the database clock) with their
    events, effects and plans, ``batch_size`` runs per transaction, at most
    ``max_batches`` batches (``None``: until none is left). Returns the cutoff and the
    counts; ``more`` says the purge stopped at ``max_batches`` with more to do."""
    before = cutoff(store.database_now(), older_than)
    total, after, batches = PurgeCounts(), None, 0
    while max_batches is None or batches < max_batches:
        batch = store.retention.purge_batch(before, batch_size, after)
        total, after, batches = total + batch.counts, batch.last, batches + 1
        if batch.selected < batch_size:
            return before, total.stopped(more=False)
    return before, total.stopped(more=True)


def preview(store: Store, older_than: timedelta) -> tuple[datetime, PurgeCounts]:
    """What :func:`purge` would delete now (nothing is written), with the cutoff."""
    before = cutoff(store.database_now(), older_than)
    return before, store.retention.preview(before)


class PeriodicPurge:
    """A worker's periodic purge, asked after every reconcile pass (:meth:`run_if_due`).

    Purges on the first pass, then once per ``interval`` (the monotonic clock), or at
    the next pass when the last one stopped at its batch bound with more to purge.
    ``deadlines_retention`` is read each time it is due: ``None`` (or 0) turns it off.
    """

    def __init__(
        self,
        interval: timedelta = PURGE_INTERVAL,
        batch_size: int = BATCH_SIZE,
        max_batches: int = MAX_BATCHES_PER_PASS,
    ) -> None:
        self.interval = interval
        self.batch_size = batch_size
        self.max_batches = max_batches
        self._last: float | None = None
        self._behind = False

    def run_if_due(self, app: Any, store: Store) -> PurgeCounts | None:
        """Purge if it is time (``None``: not due, or retention off); logs one line."""
        now = get_clock().monotonic()
        if not purge_due(self._last, now, behind=self._behind, interval=self.interval):
            return None
        # a failed purge (or a bad setting) waits for the interval too, not the next pass
        self._last, self._behind = now, False
        retention = settings_for(app).get(conf.RETENTION)
        if retention is None:
            return None
        before, counts = purge(
            store, retention, batch_size=self.batch_size, max_batches=self.max_batches
        )
        self._behind = counts.more
        logger.info(
            "purged the run ledger: %s, ended before %s (deadlines_retention %s)%s",
            counts.describe(),
            before.isoformat(timespec="seconds"),
            describe_age(retention),
            "; more at the next pass" if counts.more else "",
        )
        return counts
