"""Restart reconciliation and the outbox sweeper (docs/explanation/run-ledger.md, "Restart
reconciliation").

On worker start and every ``deadlines_reconcile_interval``, each worker's main process:

1. expires runs whose deadline passed before any worker claimed them
   (``deadline_passed``, as the claim gate says it): a lost message never becomes a run
   that waits forever;
2. reads every run whose lease has lapsed by the database clock, with its version;
3. ends it if its deadline has passed (``deadline_passed``: never resurrected);
4. marks it UNKNOWN if an effect of the attempt is unresolved (the effect ledger's
   reconciliation hook decides what happened before anything is retried);
5. fails it (``worker_lost``) if it has lost ``deadlines_max_lost_leases`` leases
   already, so a task that kills its worker does not loop until its deadline;
6. otherwise gives it back to the queue with a fresh fencing token (the old holder is
   fenced at once) and publishes its message again: the next claim resumes from the
   last durable checkpoint;

republishes runs still unclaimed ``deadlines_republish_after`` after their last
publish, and tells the callers whoever ended a run left waiting (the failures and
expiries the ledger recorded, the return values successes kept:
:func:`_tell_the_left_waiting`). Every step is a compare-and-swap on the version read
in step 2, so any number of workers may reconcile at once: one wins each run, the others
change nothing. After a pass, at most hourly, the reconciler purges ended runs older than
``deadlines_retention`` in bounded batches (:mod:`.retention`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any, Final

from billiard.exceptions import WorkerLostError
from django.db import DatabaseError, connections

from .. import conf
from ..clock import get_clock
from ..conf import settings_for
from ..rules import outcomes
from ..rules.gates import Reason, expiry_reason
from ..rules.outcomes import Found, NotFound, PendingEffect, Settle
from ..rules.states import Status
from . import celery_report
from ._crashpoints import hit
from .clockwatch import ClockWatch
from .forks import no_fork_meanwhile
from .operations import (
    ask_for_operator,
    release_settled,
    republish,
    settle_effect,
    store_refusal,
    tell_caller_failed,
    tell_caller_unknown,
)
from .retention import PeriodicPurge
from .sql.connection import Store
from .sql.effects import Pending
from .sql.rows import EndedRun, LapsedLease

logger = logging.getLogger("celery_deadlines")

#: How often a worker whose clock is uncertain measures it again (and reconciles).
RECHECK_UNCERTAIN = timedelta(seconds=1)


@dataclass
class Report:
    """What one reconciliation pass did (logged, and returned for tests and commands)."""

    expired: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    republished: list[str] = field(default_factory=list)
    resolved: list[str] = field(default_factory=list)  # effect keys

    def __bool__(self) -> bool:
        return any(ids for _, ids in self.categories())

    def categories(self) -> list[tuple[str, list[str]]]:
        """Each category's words and ids, in the order a person reads them."""
        return [(LABELS[f.name], getattr(self, f.name)) for f in fields(self)]

    def lines(self) -> list[str]:
        """One line per category with every id, the words aligned: ``expired  2: a, b``,
        ``failed  0``."""
        width = max(len(label) for label in LABELS.values())
        return [f"{label:<{width}}  {_counted(ids)}" for label, ids in self.categories()]

    def to_json(self) -> dict[str, list[str]]:
        """The ids of each category (``resolved``: effect keys), by field name."""
        return {f.name: list(getattr(self, f.name)) for f in fields(self)}

    def __str__(self) -> str:
        """What the pass did, for the log line: ``expired 2: a, b; requeued 1: c`` (at most
        :data:`LOGGED_IDS` ids per category)."""
        said = [f"{label} {_counted(ids, LOGGED_IDS)}" for label, ids in self.categories() if ids]
        return "; ".join(said) or "nothing to do"


#: The words for :class:`Report`'s categories.
LABELS: Final = {
    "expired": "expired",
    "unknown": "marked unknown",
    "failed": "failed",
    "requeued": "requeued",
    "republished": "republished",
    "resolved": "effects resolved",
}
#: Ids named per category in the log line (the command prints them all).
LOGGED_IDS: Final = 20


def _counted(ids: list[str], limit: int | None = None) -> str:
    """``2: a, b``; ``0``; past ``limit``: ``25: a, ..., t and 5 more``."""
    if not ids:
        return "0"
    shown = ids if limit is None else ids[:limit]
    more = len(ids) - len(shown)
    return f"{len(ids)}: {', '.join(shown)}" + (f" and {more} more" if more else "")


def reconcile_once(app: Any, store: Store, *, clock_certain: bool = True) -> Report:
    """One pass of reconciliation and sweeping over the whole ledger.

    ``clock_certain``: this worker's clock agrees with the ledger's (or no skew budget
    is set), so runs held as CLOCK_UNCERTAIN are published again at once.
    """
    settings = settings_for(app)
    report = Report()
    expired_runs = store.sweeps.expire_unclaimed()
    if expired_runs:
        try:
            now = store.database_now()  # one reading for the whole batch
        except DatabaseError:
            # The expiries are committed and no later pass finds these runs again: the
            # callers are told now, with the local clock's reading, or never.
            now = get_clock().now()
        for expired in expired_runs:
            report.expired.append(expired.task_id)
            store_refusal(app, store, expired, now)
    max_lost = settings.get(conf.MAX_LOST_LEASES)
    for lapsed in store.sweeps.lapsed_leases():
        _settle(app, store, lapsed, max_lost, report)
    effects = store.effects
    for pending in effects.pending():
        _reconcile_effect(app, store, pending, report)
    # an effect settled by the attempt that dispatched it (its late outcome), after its
    # run was marked UNKNOWN: nothing is left to ask, the run only waits for its release
    for run_id, task_id, task_name in effects.settled_unknown():
        _count_release(report, task_id, release_settled(app, store, run_id, task_id, task_name))
    for unclaimed in store.sweeps.unclaimed(settings.get(conf.REPUBLISH_AFTER), held=clock_certain):
        if store.sweeps.mark_republished(unclaimed.run_id, unclaimed.version):
            with no_fork_meanwhile():
                sent = republish(app, store, unclaimed.run_id, unclaimed)
            if sent:  # a message no worker would decode failed its run instead
                report.republished.append(unclaimed.task_id)
    _tell_the_left_waiting(app, store)
    if report:
        logger.info("reconciled the run ledger: %s", report)
    return report


#: How far back a pass looks for runs whose caller may not have been told, and how long
#: it leaves a just-ended run to the process that ended it.
RETELL_WINDOW: Final = timedelta(minutes=10)
RETELL_GRACE: Final = timedelta(seconds=2)
#: A pass reads at most this many pages of this many runs (the rest: the next pass).
RETELL_PAGE: Final = 200
RETELL_PAGES: Final = 25
#: Where this process's passes have looked up to: the last run looked at, as its
#: (``updated_at``, id) by the database clock (each run is looked at once per process).
_looked_up_to: tuple[datetime, int] | None = None
_looked_up_to_lock = threading.Lock()


def _tell_the_left_waiting(app: Any, store: Store) -> None:
    """Whoever ended a run and died before telling its caller left the caller waiting
    for good when no message comes back (an early-acked one, or one a broker lost): a
    reconciler that ended it FAILED or EXPIRED (the nemesis soak, seed 452933: a worker
    SIGKILLed 37 ms after its reconciler committed an expiry, the broker's data lost a
    second later), or a worker SIGKILLed between the completion's commit and Celery's
    store of the result (the chaos soak, seed 778971). Each pass looks at the runs ended
    within :data:`RETELL_WINDOW` (past :data:`RETELL_GRACE`) that it has not looked at,
    oldest first, and tells a caller whose result holds no final state what the ledger
    recorded (never over one that does): the failure, or the return value the
    completion kept. Where results expire sooner than the window, it looks back as
    far as they last (:func:`_looked_back`)."""
    global _looked_up_to
    try:
        now = store.database_now()
    except DatabaseError:
        return  # the next pass looks again
    until = now - RETELL_GRACE
    oldest = (now - _looked_back(app), 0)
    for _ in range(RETELL_PAGES):
        with _looked_up_to_lock:
            after = max(_looked_up_to or oldest, oldest)
        try:
            page = store.sweeps.ended_maybe_untold(after, until, RETELL_PAGE)
        except DatabaseError:
            return
        if not page:
            return
        # a task that stores no errors has no result that would say it was told: its
        # end was told (errbacks called) by whoever ended it, or never
        runs = [
            run
            for _, run in page
            if run.status == Status.SUCCEEDED or celery_report.stores_errors(app, run.task_name)
        ]
        waiting = set(celery_report.untold(app, [run.task_id for run in runs]))
        try:
            for run in runs:
                if run.task_id in waiting:
                    _tell(app, store, run, now)
        except DatabaseError:
            return  # the next pass reads the page again (its told runs say so then)
        with _looked_up_to_lock:
            last = page[-1][0]
            if _looked_up_to is None or last > _looked_up_to:
                _looked_up_to = last
        if len(page) < RETELL_PAGE:
            return


def _looked_back(app: Any) -> timedelta:
    """How far back a pass looks: :data:`RETELL_WINDOW`, or less where the results
    expire sooner (``result_expires``): a result gone by its expiry would read as one
    never stored, and its caller be told again."""
    expires = app.conf.result_expires
    if isinstance(expires, int | float) and not isinstance(expires, bool):
        expires = timedelta(seconds=expires)
    if isinstance(expires, timedelta) and expires > timedelta(0):
        return min(RETELL_WINDOW, expires - RETELL_GRACE)
    return RETELL_WINDOW


def _tell(app: Any, store: Store, run: EndedRun, now: datetime) -> None:
    """Tell the caller whose result holds no final state how ``run`` ended: the return
    value a success kept (read now), or the failure or expiry the ledger recorded."""
    if run.status == Status.SUCCEEDED:
        ended = store.runs.ended(run.task_id)  # with the value its completion kept
        if ended is not None and celery_report.tell_succeeded(app, store, ended):
            logger.warning(
                "%s[%s] SUCCEEDED and its caller was not told (its worker stopped between "
                "the ledger's commit and the result's store); told now: the return value "
                "the ledger kept",
                run.task_name,
                run.task_id,
            )
        return
    logger.warning(
        "%s[%s] ended %s (%s) by the ledger, and its caller was not told (whoever ended "
        "it stopped before telling it); told now",
        run.task_name,
        run.task_id,
        run.status,
        run.reason,
    )
    error = run.told_as(now, WorkerLostError)
    celery_report.tell_failed(app, store, run.task_id, run.task_name, error)


def _settle(app: Any, store: Store, lapsed: LapsedLease, max_lost: int, report: Report) -> None:
    """Settle one lapsed lease as :func:`~celery_deadlines.rules.outcomes.settle_lapsed` says.
    Every write is conditioned on the version read (and on whether an effect of the
    attempt is unresolved), so of several reconcilers reading the same lapsed run one
    acts and the others change nothing."""
    unresolved = store.effects.unresolved(lapsed.run_id)
    step = outcomes.settle_lapsed(
        unresolved_effect=unresolved,
        past_deadline=lapsed.past_deadline,
        lost_leases=lapsed.lost_leases,
        max_lost=max_lost,
    )
    if step is Settle.UNKNOWN:
        # the run waits for the effect's reconciliation before anything else (past its
        # deadline too: the outcome is recorded, then the run ends EXPIRED)
        detail = "lease lapsed after a dispatch with no recorded outcome"
        with store.transaction():  # never seen UNKNOWN with its effect still DISPATCHED
            marked = store.sweeps.settle_lapsed(
                lapsed, Status.UNKNOWN, "effect_unresolved", detail, unresolved=True
            )
            if marked:
                store.effects.mark_unknown(lapsed.run_id, lapsed.token)
        if marked:
            report.unknown.append(lapsed.task_id)
            tell_caller_unknown(app, store, lapsed.run_id, lapsed.task_id, detail)
            ask_for_operator(app, store, lapsed.run_id, lapsed.task_id, lapsed.task_name, detail)
    elif step is Settle.EXPIRE:
        detail = f"lease of {lapsed.owner} lapsed and the deadline has passed"
        reason = (
            Reason.CANCELLED
            if lapsed.cancelled
            else expiry_reason(delivery_task=lapsed.delivery_task)
        )
        if store.sweeps.settle_lapsed(lapsed, Status.EXPIRED, reason, detail):
            report.expired.append(lapsed.task_id)
            expired = EndedRun(
                task_id=lapsed.task_id,
                task_name=lapsed.task_name,
                status=Status.EXPIRED,
                reason=reason,
                deadline=lapsed.deadline,
            )
            store_refusal(app, store, expired, store.database_now(), detail)
    elif step is Settle.FAIL:
        detail = f"lost {lapsed.lost_leases + 1} leases (deadlines_max_lost_leases={max_lost})"
        if store.sweeps.settle_lapsed(lapsed, Status.FAILED, "worker_lost", detail):
            report.failed.append(lapsed.task_id)
            failure = WorkerLostError(detail)
            tell_caller_failed(app, store, lapsed.task_id, lapsed.task_name, failure)
    elif store.sweeps.requeue_lapsed(lapsed):
        with no_fork_meanwhile():
            republish(app, store, lapsed.run_id)
        report.requeued.append(lapsed.task_id)


def _reconcile_effect(app: Any, store: Store, pending: Pending, report: Report) -> None:
    """Ask the task's reconciler what happened to the dispatch ``pending``; settle it
    (if it is still what was asked about) and release the run."""
    task = app.tasks.get(pending.task_name)
    reconciler = getattr(task, "effect_reconciler", lambda name: None)(pending.name)
    if reconciler is None:
        return  # an operator resolves it (admin); the run stays UNKNOWN meanwhile
    question = PendingEffect(
        pending.key,
        pending.name,
        pending.fingerprint,
        pending.lease_token,
        pending.task_id,
        pending.dispatches,
    )
    try:
        with no_fork_meanwhile():  # the reader's code: its imports, its client's locks
            answer = reconciler(question)
    except Exception:  # the effect stays UNKNOWN: never guessed
        logger.exception("the reconciler of effect %s failed; it stays UNKNOWN", pending.key)
        return
    if not isinstance(answer, (Found, NotFound)):
        logger.error(
            "the reconciler of effect %s returned %r, not Found or NotFound; it stays UNKNOWN",
            pending.key,
            answer,
        )
        return
    hit("reconcile.answered", pending.task_id)
    result = answer.result if isinstance(answer, Found) else None
    settled = settle_effect(
        app,
        store,
        pending,
        found=isinstance(answer, Found),
        result=result,
        evidence=answer.evidence,
        by="reconciler",
    )
    if settled.applied:
        report.resolved.append(pending.key)
        _count_release(report, pending.task_id, settled.released)


def _count_release(report: Report, task_id: str, released: str | None) -> None:
    if released == Status.QUEUED:
        report.requeued.append(task_id)
    elif released == Status.EXPIRED:
        report.expired.append(task_id)


_running: Reconciler | None = None


def running() -> Reconciler | None:
    """This worker's reconciler (main process), if it runs."""
    return _running


class Reconciler:
    """Runs :func:`reconcile_once` at worker start and then periodically, in a thread."""

    def __init__(
        self, app: Any, store: Store, interval: timedelta | None, watch: ClockWatch | None = None
    ) -> None:
        self.app = app
        self.store = store
        self.interval = interval
        #: measures the worker's clock on every pass (``deadlines_clock_skew_budget``)
        self.watch = watch
        if watch is not None:
            watch.on_suspect = self.wake
        #: ended runs older than ``deadlines_retention`` go, at most hourly
        self.purge = PeriodicPurge()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="celery-deadlines-reconciler", daemon=True
        )

    def start(self) -> None:
        """Start the thread; this is now the worker's :func:`running` reconciler."""
        global _running
        _running = self
        self._thread.start()

    def wake(self) -> None:
        """Reconcile now (a pool process was just lost)."""
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        global _running
        if _running is self:
            _running = None
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def run_pass(self) -> bool:
        """One pass: measure the clock, reconcile, purge if due (:class:`PeriodicPurge`).
        Returns whether this worker's clock is certain. Errors are logged, not raised."""
        certain = True
        try:
            if self.watch is not None:
                self.watch.check()
                certain = not self.watch.uncertain
            reconcile_once(self.app, self.store, clock_certain=certain)
        except Exception:  # a database outage must not end reconciliation
            logger.exception("reconciling the run ledger failed; trying again")
        try:
            self.purge.run_if_due(self.app, self.store)
        except Exception:
            logger.exception("purging the run ledger failed; trying again in an interval")
        return certain

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                certain = self.run_pass()
                if self.interval is None and certain:
                    return
                # a worker holding its work for its clock looks again soon
                wait = self.interval if certain and self.interval is not None else None
                if not certain:
                    wait = min(self.interval or RECHECK_UNCERTAIN, RECHECK_UNCERTAIN)
                assert wait is not None
                self._wake.wait(wait.total_seconds())
                self._wake.clear()
        finally:
            self.store.close()
            connections.close_all()
