"""Cancel a run with everything it started (``celery_deadlines.cancel``): the ledger's
deadline pulled in, for the run and every descendant it recorded.

A cancel is a deadline, not a message to a worker: it is one write to the ledger, read
by whoever acts on a run next (the claim refuses it ``cancelled``, a renewal past it
fails, the sweeper ends it ``cancelled``), so it reaches work queued behind a busy
worker, and work whose worker is down, as Celery's ``revoke`` cannot. One broadcast then
prompts the workers that are up to pull in the hard limits of the cancelled runs they
are running (:func:`hard_limits_fall`), which asks the ledger which those are.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery import current_app
from celery.signals import worker_init

from .. import ledger
from ..errors import ConfigurationError
from ..rules.gates import Reason
from ..rules.outcomes import CELERY_REVOKED
from ..signals import run_expired
from . import timelimits
from .body import AttemptAPI
from .claiming import result_policy

logger = logging.getLogger("celery_deadlines")

#: Who cancelled, when the caller does not say (each run's history keeps it).
BY_DEFAULT = "celery_deadlines.cancel()"


def cancel(
    task_id: str,
    *,
    reason: str = "",
    at: datetime | None = None,
    by: str = BY_DEFAULT,
    app: Any = None,
) -> int:
    """Cancel the run of ``task_id`` and every run it started, down its tree: each
    unended one's deadline is pulled in to now (``at``: an earlier instant, aware),
    never lengthened, and marked ``cancelled`` with ``reason`` and ``by`` in its
    history, in one statement whatever the tree's size.

    Queued runs are refused at their claim (nothing of their bodies runs) or ended by
    the reconciler's sweeper, with the reason ``cancelled``, and their callers see
    ``REVOKED`` (``TaskRevokedError('revoked')``); a running attempt's next lease
    renewal fails, and it is refused a retry, and the workers that are up are told
    (:func:`tell_workers`): the hard limit of each cancelled run they are running falls
    to one lease. Returns how many runs it changed: 0 for a run that had ended, or that
    the ledger does not hold.

    Without the ledger (``"celery_deadlines"`` not in ``INSTALLED_APPS``) no run's
    descendants are known, and a cancel does what Celery's revoke can: it sends
    ``app.control.revoke(task_id)``, which discards that one message on the workers
    that are up (a WARNING says so), and returns 1; ``at`` needs the ledger
    (:class:`~celery_deadlines.errors.ConfigurationError`).
    """
    app = app or current_app
    if at is not None and at.tzinfo is None:
        raise ValueError(f"cancel: at={at!r} is naive; give an aware datetime")
    if not ledger.active() or not ledger.enabled_for(app):
        return _revoke_alone(app, task_id, reason=reason, at=at)
    from ..ledger import api, operations

    changed = operations.cancel_run(api.store_for(app), task_id, reason=reason, by=by, at=at)
    if changed:
        tell_workers(app)
    return changed


#: The workers' remote control command a cancel broadcasts (:func:`hard_limits_fall`).
COMMAND = "deadlines_cancelled"


def tell_workers(app: Any) -> None:
    """Tell the workers that are up that runs were cancelled, so that the hard limits of
    those they are running fall (:func:`hard_limits_fall`): one broadcast, no reply
    awaited. A broker that cannot take it loses nothing: the cancel is written, each
    attempt learns it at its renewal, and its hard limit stays where it was (a
    WARNING says so)."""
    try:
        app.control.broadcast(COMMAND)
    except Exception:
        logger.warning(
            "telling the workers of a cancel failed: the running attempts still learn it "
            "at their next lease renewal, but their hard time limits stay as they were",
            exc_info=True,
        )


def hard_limits_fall(state: Any, **_: Any) -> dict[str, int]:
    """The worker's remote control command :data:`COMMAND`, in the process that
    supervises its jobs: of the runs it is running, those the ledger says were
    cancelled have their hard limits fall to one lease from now
    (:func:`~.timelimits.fall`), the instant by which that lease, never renewed past a
    cancel, has lapsed. Their bodies learn the cancel at their next renewal, a third of
    a lease in (``remaining()`` 0, effects and calls refused), and have the rest of the
    lease to return; a body still running then is ended as a hard time limit ends it
    (:func:`~.supervision.time_limit_outcome`: ``EXPIRED cancelled``, its caller told
    ``REVOKED``). The command's arguments, which anyone who can publish to the broker
    may write, are ignored: which runs were cancelled is the ledger's word alone."""
    from celery.worker.state import active_requests

    from ..ledger import api

    running = {  # a request whose limit fell already keeps it: a later fall is later
        request.id: request
        for request in list(active_requests)
        if isinstance(request.task, AttemptAPI)
        and not getattr(request, FELL, False)
        and ledger.enabled_for(request.task.app)
    }
    if not running:
        return {"fell": 0}
    app = state.consumer.app
    try:
        cancelled = api.cancelled_running(app, list(running))
    except Exception:
        logger.exception("reading which of the runs of this worker were cancelled failed")
        return {"fell": 0}
    fell = 0
    for task_id in sorted(cancelled):
        request = running[task_id]
        lease = request.task.lease_duration()
        if timelimits.fall(state.consumer.pool, request, lease.total_seconds()):
            setattr(request, FELL, True)
            fell += 1
            logger.warning(
                "%s[%s] was cancelled: its hard time limit falls to %.3f s from now",
                request.name,
                task_id,
                lease.total_seconds(),
            )
    return {"fell": fell}


#: The attribute of a worker's request whose hard limit a cancel pulled in.
FELL = "_celery_deadlines_limit_fell"


def connect() -> None:
    """Register :func:`hard_limits_fall` as a worker's remote control command when a
    worker starts (idempotent; nothing in a process that is not a worker)."""
    worker_init.connect(_register, dispatch_uid=COMMAND, weak=False)


def _register(**_: Any) -> None:
    from celery.worker.control import control_command

    control_command(name=COMMAND)(hard_limits_fall)


def _revoke_alone(app: Any, task_id: str, *, reason: str, at: datetime | None) -> int:
    """A cancel without the ledger: Celery's revoke of the one message ``task_id``."""
    if at is not None:
        raise ConfigurationError(
            "cancel(at=...) needs the run ledger (celery_deadlines in INSTALLED_APPS): "
            "without it a cancel is Celery's revoke, which takes effect when it arrives"
        )
    app.control.revoke(task_id)
    logger.warning(
        "run %s revoked (%s): without the run ledger a cancel is Celery's revoke of this "
        "one message, on the workers that are up; what it started is not known, and a "
        "body already running runs on",
        task_id,
        reason or "no reason given",
    )
    return 1


class TerminatedByCancel(BaseException):
    """Raised in the body of a task that declares ``cancel_terminates = True`` when its
    attempt learns that its run was cancelled (Celery's ``terminate``, in the body's own
    thread): a ``BaseException``, so that an ``except Exception`` in the body does not
    swallow it (its ``finally`` blocks run). Never raised in the middle of an effect's
    dispatch (it waits for the effect's outcome), and never told to a caller: the run
    ends ``EXPIRED cancelled``, its caller told ``REVOKED``."""


def _green() -> bool:
    """Whether threads are greenlets here (gevent's or eventlet's patching): a thread id
    names no thread an exception can be raised in."""
    gevent = sys.modules.get("gevent.monkey")
    if gevent is not None and gevent.is_module_patched("threading"):
        return True
    eventlet = sys.modules.get("eventlet.patcher")
    return eventlet is not None and bool(eventlet.is_monkey_patched("thread"))


class Termination:
    """The body of one attempt, which a cancel learnt at a lease renewal terminates at
    once (:class:`TerminatedByCancel`, raised in the body's thread where it next runs
    Python code: a blocking call, a sleep, ends first), unless an effect is being
    dispatched: then when its outcome is written. Made in the body's thread
    (:func:`terminable`); told of the cancel from the heartbeat's thread."""

    def __init__(self, thread: int) -> None:
        self._thread = thread
        self._lock = threading.Lock()
        #: the body runs (between :meth:`body_started` and :meth:`body_ended`)
        self._running = False
        #: effects whose dispatch has begun and whose outcome is not written yet
        self._dispatching = 0
        #: a cancel came while one was: raised when the last one's outcome is written
        self._due = False
        #: raised once at most
        self._sent = False

    def cancel_learnt(self) -> None:
        """The attempt's run was cancelled (the heartbeat's thread)."""
        with self._lock:
            if not self._running or self._sent:
                return
            if self._dispatching:
                self._due = True
                return
            self._sent = True
            _raise_in(self._thread, TerminatedByCancel)

    def effect_begins(self) -> None:
        with self._lock:
            self._dispatching += 1

    def effect_ended(self) -> None:
        """An effect's outcome was written (the body's thread): a cancel that came
        meanwhile terminates the body now."""
        with self._lock:
            self._dispatching -= 1
            due = self._due and not self._dispatching and self._running and not self._sent
            if due:
                self._sent = True
        if due:
            raise TerminatedByCancel("cancelled: terminated after its effect's outcome")

    def body_started(self) -> None:
        with self._lock:
            self._running = True

    def body_ended(self) -> None:
        """The body returned or raised (the body's thread): a termination not raised yet
        never will be."""
        with self._lock:
            self._running = False
            sent = self._sent
        if sent:
            _withdraw_pending()


class _Withdrawn(BaseException):
    """Takes the place of a termination not raised yet, and is caught where it is."""


def _raise_in(thread: int, exc: type[BaseException]) -> None:
    """Raise ``exc`` in ``thread`` where it next runs Python code: CPython's
    ``PyThreadState_SetAsyncExc``."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(exc))


def _withdraw_pending() -> None:
    """Withdraw a termination still pending in this thread by raising a marker in its
    place and catching it here. Never by ``PyThreadState_SetAsyncExc(thread, NULL)``:
    before Python 3.13 that leaves the interpreter's eval breaker signalled with nothing
    to raise, and every thread of the process then takes the interpreter's slow path at
    every check, for good (a traced loop no longer ends)."""
    try:
        _raise_in(threading.get_ident(), _Withdrawn)
        for _ in range(1_000):  # raised at the next check: the call's return, or the loop's
            pass
    except _Withdrawn:
        return
    raise RuntimeError("a withdrawn termination was not raised in its own thread")


def termination_for(task: Any, request: Any) -> Termination | None:
    """The :class:`Termination` of the attempt about to run ``task``'s body on this
    thread, if the task declares ``cancel_terminates`` and its body can be terminated
    here: a worker's body on a thread of its own (prefork, threads, solo); not an eager
    one (the caller's own thread), nor on a green pool (a greenlet's thread is the
    worker's: there the body stops at ``remaining()``)."""
    if not getattr(task, "cancel_terminates", False) or request.is_eager or _green():
        return None
    return Termination(threading.get_ident())


def terminable(
    termination: Termination | None, run: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """``run(*args, **kwargs)``, the body, which ``termination`` may terminate meanwhile."""
    if termination is None:
        return run(*args, **kwargs)
    termination.body_started()
    try:
        return run(*args, **kwargs)
    finally:
        termination.body_ended()


def learnt(state: Any, deadline: datetime, monotonic: float) -> None:
    """A lease renewal found the attempt's run cancelled (the heartbeat's thread): its
    deadline is pulled in (:func:`~.propagation.pull_in`), its body's queries follow it
    (:func:`~.database.pull_in`), and a body whose task declares ``cancel_terminates``
    is terminated."""
    from .propagation import pull_in, pulled_in

    was = state.anchor
    pulled = None if was is None else pulled_in(was, deadline, monotonic)
    if pulled is not None:
        from .database import pull_in as queries_follow  # where a ledger's body runs

        # first: once remaining() reads 0, no query the body sends is given the old time
        queries_follow(was, pulled)
    pull_in(state, deadline, monotonic)
    attempt = state.attempt
    termination = attempt.termination if attempt is not None else None
    if termination is not None:
        termination.cancel_learnt()


def announce_ended(task: Any, task_id: str, detail: str, context: Any) -> None:
    """A running attempt of a cancelled run ended it ``cancelled`` (its body ended, or
    its fallen hard limit ended the body): logged and signalled as every run the ledger
    ends for its deadline away from a gate (:data:`~celery_deadlines.signals.run_expired`,
    ``reason="cancelled"``), and its caller told Celery's revoke (``REVOKED``), as every
    run of a cancelled tree is (``context``: the request Celery stores a result with)."""
    reason = Reason.CANCELLED.value
    logger.warning("%s[%s] EXPIRED (%s): %s", task.name, task_id, reason, detail)
    run_expired.send(
        sender=task, task_id=task_id, task_name=task.name, reason=reason, detail=detail
    )
    if result_policy(task).stores_errors:
        try:
            task.backend.mark_as_revoked(task_id, CELERY_REVOKED, request=context)
        except Exception:  # the ledger holds the outcome
            logger.exception("storing the REVOKED state of %s failed", task_id)
