"""One event-loop timer for the time limits of every job of a prefork worker.

Celery's ``AsynPool`` (the worker's main process) sets a timer on the event loop for each
job that has a time limit, when a pool process starts the job (``on_timeout_set``), and
cancels it when the job ends (``on_timeout_cancel``). kombu keeps a cancelled timer in
the loop's heap until its instant comes: a timer entry, its weak proxy, its arguments
and the heap's tuple, about 500 bytes a job. Every job of a DeadlineTask has a hard
limit, the deadline's cap (``DeadlineRequest.time_limits``), so a worker would hold that
for every task it ran within the last budget's length (bench/README.md measures it).

:func:`patch` (called in a worker's main process by Celery's ``worker_init`` signal,
which :func:`~celery_deadlines.install.install` connects :func:`connect` to, before
the pool starts) gives every ``AsynPool`` a :class:`JobLimits` instead: the running
jobs' limits in a dict and one loop timer, set for the earliest of them. When it fires
it calls the pool's own ``_on_soft_timeout`` or ``_on_hard_timeout`` for each job whose
limit has come, as Celery's per-job timer would, at the same instants (a soft limit's
follow-up hard timer is still Celery's own, as before). A job without limits sets
nothing, as before.

It also keeps what a job's limits are made of, so that a deadline only shortens them
(:mod:`celery_deadlines.rules.limits`): the worker's own defaults, read once from the
``WorkController`` that ``worker_init`` sends (:func:`record_worker_limits`); which of a
task's limits Celery copied from the app's settings at bind (:func:`note_app_copies`,
Celery 5.7); and the record of what a job was given, which the main process hands the
pool process with the job (:data:`HANDED`, read by :func:`handed`).
"""

from __future__ import annotations

import logging
import math
import sys
from typing import Any, Final

from celery.app.task import Context
from celery.signals import worker_init

from .. import clock
from ..rules import limits

logger = logging.getLogger("celery_deadlines")

#: Set on the patched method, so that :func:`patch` wraps Celery's own only once.
_MARK: Final = "_celery_deadlines_job_limits"


class JobLimits:
    """The time limits of one pool's running jobs, on one timer of its event loop."""

    def __init__(self, pool: Any, hub: Any) -> None:
        self.pool = pool
        self.hub = hub
        #: job -> (when its limit comes, on the monotonic clock; soft; hard)
        self.due: dict[int, tuple[float, float | None, float | None]] = {}
        #: job -> when its hard limit comes, pulled in by a cancel (:meth:`fall`)
        self.fallen: dict[int, float] = {}
        #: the loop timer's entry and the instant it is set for, while it is set
        self._entry: Any = None
        self._armed_at: float | None = None

    def rebind(self, hub: Any) -> None:
        """The pool registered with an event loop again (after a broker reconnection)."""
        if hub is not self.hub:
            self._disarm()
            self.hub = hub
            if self.due or self.fallen:
                self._arm(self._earliest())

    def on_timeout_set(self, result: Any, soft: float | None, hard: float | None) -> None:
        """A pool process started ``result``'s job: its first limit is the soft one if it
        has one (Celery's ``_on_soft_timeout`` sets the hard one's timer then)."""
        first = soft or hard
        if not first:
            return
        when = clock.monotonic() + first
        self.due[result._job] = (when, soft, hard)
        armed_at = self._armed_at  # as _arm_for, inline: this runs for every job
        if armed_at is None or when < armed_at:
            self._arm(when)

    def fall(self, job: int, seconds: float) -> None:
        """A cancel: ``job``'s hard limit falls to ``seconds`` from now (a limit of its
        own that comes earlier still applies first)."""
        when = clock.monotonic() + seconds
        if when < self.fallen.get(job, when + 1):
            self.fallen[job] = when
            self._arm_for(when)

    def on_timeout_cancel(self, result: Any) -> None:
        """``result``'s job ended: its limits are off (the timer stays set for the
        earliest limit it was set for, and finds nothing due if that job has ended)."""
        job = result._job
        self.fallen.pop(job, None)
        due = self.due.pop(job, None)
        if due is not None and not due[1]:
            return  # no soft limit was set: Celery set no hard timer after one
        trefs = getattr(self.pool, "_tref_for_id", None)
        if trefs and job in trefs:  # the hard timer Celery set after a soft limit
            self.pool._discard_tref(job)

    def _arm_for(self, when: float) -> None:
        """Set the timer for ``when`` unless it is set for an earlier instant already."""
        if self._armed_at is None or when < self._armed_at:
            self._arm(when)

    def _arm(self, when: float) -> None:
        # the timer it replaces stays in kombu's heap until its instant, as Celery's did:
        # one for each time a job's limit came before all others', not one per job
        self._disarm()
        self._armed_at = when
        self._entry = self.hub.call_later(max(when - clock.monotonic(), 0.0), self._fire)

    def _disarm(self) -> None:
        if self._entry is not None:
            self._entry.cancel()
        self._entry = None
        self._armed_at = None

    def _fire(self) -> None:
        """Apply each limit that has come, then set the timer for the next one."""
        self._entry = None
        self._armed_at = None
        now = clock.monotonic()
        for job in [job for job, when in self.fallen.items() if when <= now]:
            del self.fallen[job]
            self.due.pop(job, None)
            try:
                self.pool._on_hard_timeout(job)
            except Exception:  # one job's failure must not keep the others' limits off
                logger.exception("applying the hard limit of cancelled job %s failed", job)
        for job in [job for job, (when, _, _) in self.due.items() if when <= now]:
            _, soft, hard = self.due.pop(job)
            try:
                if soft:
                    self.pool._on_soft_timeout(job, soft, hard, self.hub)
                else:
                    self.pool._on_hard_timeout(job)
            except Exception:  # one job's failure must not keep the others' limits off
                logger.exception("applying the time limit of job %s failed", job)
        if self.due or self.fallen:  # set again for the earliest (a handler may have set it)
            self._arm_for(self._earliest())

    def _earliest(self) -> float:
        return min(
            min((when for when, _, _ in self.due.values()), default=math.inf),
            min(self.fallen.values(), default=math.inf),
        )


def fall(pool: Any, request: Any, seconds: float) -> bool:
    """A cancel: the hard limit of ``request``'s running job falls to ``seconds`` from
    now, on the pools that apply one: prefork's, on its main process's timer
    (:meth:`JobLimits.fall`; Celery's ``_on_hard_timeout`` then, as at any hard limit);
    gevent's and eventlet's, whose limit is the job's green thread told its ``Timeout``.
    ``False`` where no limit can fall: a job that has ended, the threads and solo
    pools (to which Celery applies no time limit), or an eventlet job not capped by a
    deadline (Celery's eventlet pool applies none)."""
    ref = getattr(request, "_apply_result", None)
    job = ref() if callable(ref) else None
    if job is None:
        return False
    limits = getattr(getattr(pool, "_pool", None), _MARK, None)
    if isinstance(limits, JobLimits):
        number = getattr(job, "_job", None)
        if not isinstance(number, int):
            return False
        limits.fall(number, seconds)
        return True
    return _fall_green(job, seconds)


def _fall_green(green: Any, seconds: float) -> bool:
    """:func:`fall` on a green pool: ``green`` (the job's green thread) is told its
    pool's ``Timeout`` in ``seconds``, which the pool's time limit handles as its own."""
    gevent = sys.modules.get("gevent")
    if gevent is not None and isinstance(green, gevent.Greenlet):
        gevent.spawn_later(seconds, _time_out_gevent, green)
        return True
    eventlet = sys.modules.get("eventlet")
    if eventlet is not None and getattr(green, _CAPPED, False):
        eventlet.spawn_after(seconds, _time_out_eventlet, green)
        return True
    return False


def _time_out_gevent(green: Any) -> None:
    from gevent import Timeout

    if not green.dead:
        green.kill(Timeout(), block=False)


def _time_out_eventlet(green: Any) -> None:
    from eventlet import Timeout

    if not green.dead:
        green.kill(Timeout())


def connect() -> None:
    """Patch ``AsynPool`` and keep the worker's default limits in a worker's main
    process when it starts; and name :data:`HANDED` one of the request's own fields
    in Celery's ``Context``, whose other keys Celery takes for the caller's headers
    (idempotent)."""
    worker_init.connect(_on_worker_init, dispatch_uid=_MARK, weak=False)
    if HANDED not in Context.__dict__:
        setattr(Context, HANDED, None)


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    patch()
    record_worker_limits(sender)
    patch_eventlet()


# -- what a job's limits are made of -------------------------------------------------------

#: The app's attribute that keeps its worker's default limits (:func:`record_worker_limits`).
WORKER_LIMITS: Final = "_celery_deadlines_worker_limits"
#: A task class's attribute that keeps the limits Celery copied onto it from the app's
#: settings at bind, by name (:func:`note_app_copies`, read by :func:`limits.own_limit`).
APP_COPIES: Final = limits.APP_COPIES
#: The key of a job's request (the dict the main process hands the pool process) under
#: which it says what limits the job was given (:data:`limits.Handed`). Also a class
#: attribute of Celery's ``Context``, so that Celery does not take it for a header of
#: the caller's (and publish it again with a retry): see :func:`connect`.
HANDED: Final = "_celery_deadlines_limits"
#: A task's time limit attributes and the app's settings Celery 5.7 copies into them.
TASK_LIMITS: Final = (
    ("time_limit", "task_time_limit"),
    ("soft_time_limit", "task_soft_time_limit"),
)

#: The worker's default limits: hard, who set it, soft, who set it.
WorkerLimits = tuple[float | None, str | None, float | None, str | None]


def record_worker_limits(worker: Any) -> None:
    """Keep, on the worker's app, the limits its pool applies to a job that has none:
    the worker's ``time_limit`` and ``soft_time_limit`` (Celery's ``either``: the
    command line's ``--time-limit``, else the app's ``task_time_limit``), each with who
    set it (a value that is the app's setting is the app's). A value that is not a
    duration (a setting of another type) is not one the library can shorten: it is
    left to Celery, as none."""
    app = getattr(worker, "app", None)
    if app is None:
        return
    conf = app.conf
    hard, hard_by = _worker_limit(getattr(worker, "time_limit", None), conf.get("task_time_limit"))
    soft, soft_by = _worker_limit(
        getattr(worker, "soft_time_limit", None), conf.get("task_soft_time_limit")
    )
    kept: WorkerLimits = (hard, hard_by, soft, soft_by)
    setattr(app, WORKER_LIMITS, kept)


def _worker_limit(value: object, setting: object) -> tuple[float | None, str | None]:
    if not _is_duration(value):
        return None, None
    return value, limits.APP if value == setting else limits.WORKER  # type: ignore[return-value]


def _is_duration(value: object) -> bool:
    return type(value) in (int, float) and value > 0  # type: ignore[operator]


def worker_limits(app: Any) -> WorkerLimits | None:
    """The worker's default limits, as :func:`record_worker_limits` kept them on
    ``app`` (``None``: not a worker's app, or not recorded)."""
    kept: WorkerLimits | None = getattr(app, WORKER_LIMITS, None)
    return kept


def note_app_copies(cls: Any, unset: tuple[str, ...], conf: Any) -> None:
    """After Celery bound the task class ``cls``: of its limits ``unset`` before the
    bind, keep those Celery then copied from the app's settings (Celery 5.7's
    ``from_config``; 5.5 and 5.6 copy none), by name. Those are the app's limits, not
    the task's own: the pool's default, which the worker's command line may differ
    from, and no measure of what one attempt of this task takes."""
    copies = dict(getattr(cls, APP_COPIES, None) or {})  # a bound base class's too
    for name, setting in TASK_LIMITS:
        value = getattr(cls, name, None)
        if name in unset and value is not None and value == conf.get(setting):
            copies[name] = value
    setattr(cls, APP_COPIES, copies)


def unset_limits(cls: Any) -> tuple[str, ...]:
    """The time limit attributes of the task class ``cls`` that say nothing (before
    Celery binds it: :func:`note_app_copies`)."""
    return tuple(name for name, _ in TASK_LIMITS if getattr(cls, name, None) is None)


def handed(request: Any, task: Any) -> limits.AttemptLimits | None:
    """What the worker's main process handed the pool with this job (:data:`HANDED`: the
    hard and soft limits of the deadline's cap, both ``None`` without one, and the
    worker's defaults), as who set each:
    Celery's own limits worked out here from the job's request (the message's
    ``timelimit``), ``task`` and those defaults, as the main process did
    (:func:`limits.celery_applies`), and a limit shorter than those the deadline's.
    ``None`` when the request says nothing this process can read: the record came with
    the message, whose headers anyone may write, and is checked as any of them."""
    record = getattr(request, HANDED, None)
    if not isinstance(record, (tuple, list)) or len(record) != 3:
        return None
    hard, soft, worker = record
    if worker is None:
        worker = (None, None, None, None)
    elif not _worker_record(worker):
        return None
    message = getattr(request, "timelimit", None) or (None, None)
    if not isinstance(message, (tuple, list)) or len(message) != 2:
        return None
    if not all(value is None or _is_duration(value) for value in (*message, hard, soft)):
        return None
    copies = getattr(task, APP_COPIES, None) or {}
    task_hard, task_soft = getattr(task, "time_limit", None), getattr(task, "soft_time_limit", None)
    celery_hard, hard_by = limits.celery_applies(
        message[0],
        task_hard,
        limits.APP
        if task_hard is not None and task_hard == copies.get("time_limit")
        else limits.TASK,
        worker[0],
        worker[1],
    )
    celery_soft, soft_by = limits.celery_applies(
        message[1],
        task_soft,
        limits.APP
        if task_soft is not None and task_soft == copies.get("soft_time_limit")
        else limits.TASK,
        worker[2],
        worker[3],
    )
    if hard is None:  # no cap (the deadline's cap always sets one): Celery's own
        hard, soft = celery_hard, celery_soft
    return limits.given((hard, soft, celery_hard, hard_by, celery_soft, soft_by))


def _worker_record(worker: object) -> bool:
    """Whether ``worker`` is a record :func:`record_worker_limits` keeps."""
    if not isinstance(worker, (tuple, list)) or len(worker) != 4:
        return False
    return all(
        (value is None and source is None)
        or (_is_duration(value) and source in (limits.APP, limits.WORKER))
        for value, source in ((worker[0], worker[1]), (worker[2], worker[3]))
    )


def patch_eventlet() -> None:
    """Give Celery's eventlet pool the hard stop at the deadline its gevent pool has: a
    job whose hard time limit is the deadline's cap runs under eventlet's ``Timeout``,
    raised in its green thread where it next yields, and the request is told as the
    gevent pool tells it (``on_timeout(False, limit)``). Celery's eventlet pool ignores
    time limits otherwise, and still ignores a task's own limit, which the deadline did
    not set. Nothing in a worker of another pool; once per process."""
    if "eventlet" not in sys.modules:  # not an eventlet worker (``-P eventlet`` imports it first)
        return
    from celery.concurrency.eventlet import TaskPool

    original = TaskPool.__dict__["on_apply"]
    if getattr(original, _MARK, False):
        return

    def on_apply(
        pool: Any,
        target: Any,
        args: Any = None,
        kwargs: Any = None,
        callback: Any = None,
        accept_callback: Any = None,
        **options: Any,
    ) -> Any:
        limit = options.get("timeout")
        on_timeout = options.get("timeout_callback")
        if not limit or not getattr(getattr(on_timeout, "__self__", None), _CAPPED, False):
            return original(pool, target, args, kwargs, callback, accept_callback, **options)
        # Celery's own on_apply, with gevent's apply_timeout in place of apply_target
        target = pool._make_killable_target(target)
        pool._quick_apply_sig(sender=pool, target=target, args=args, kwargs=kwargs)
        green = pool._quick_put(
            _apply_until,
            target,
            args,
            kwargs,
            callback,
            accept_callback,
            pool.getpid,
            limit,
            on_timeout,
        )
        pool._add_to_pool_map(id(green), green)
        setattr(green, _CAPPED, True)  # its limit can fall to a cancel (:func:`fall`)
        return green  # the request keeps a reference to it, as to a gevent job's

    on_apply.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(on_apply, _MARK, True)
    TaskPool.on_apply = on_apply  # type: ignore[method-assign,assignment]


#: The request's attribute that says its hard limit is the deadline's cap.
_CAPPED: Final = "_capped_by_deadline"


def _apply_until(
    target: Any,
    args: Any,
    kwargs: Any,
    callback: Any,
    accept_callback: Any,
    getpid: Any,
    limit: float,
    on_timeout: Any,
) -> Any:
    """Celery's ``apply_target`` under eventlet's ``Timeout`` of ``limit`` seconds, as
    ``celery.concurrency.gevent.apply_timeout`` runs it under gevent's."""
    from celery.concurrency.base import apply_target
    from eventlet import Timeout

    try:
        with Timeout(limit):
            return apply_target(
                target,
                args,
                kwargs or {},
                callback,
                accept_callback,
                pid=getpid(),
                propagate=(Timeout,),
            )
    except Timeout:
        return on_timeout(False, limit)


def patch() -> None:
    """Give every ``AsynPool`` a :class:`JobLimits` when it registers with an event loop
    (once per process; nothing where Celery's prefork pool cannot be imported)."""
    try:
        from celery.concurrency.asynpool import AsynPool
    except ImportError:  # pragma: no cover - a platform without the prefork pool
        return
    original = AsynPool.__dict__["_create_timelimit_handlers"]
    if getattr(original, _MARK, False):
        return

    def _create_timelimit_handlers(pool: Any, hub: Any) -> None:
        original(pool, hub)  # Celery's own: the mapping a soft limit's hard timer uses
        limits: JobLimits | None = getattr(pool, _MARK, None)
        if limits is None:
            limits = JobLimits(pool, hub)
            setattr(pool, _MARK, limits)
        else:
            limits.rebind(hub)
        pool.on_timeout_set = limits.on_timeout_set
        pool.on_timeout_cancel = limits.on_timeout_cancel

    _create_timelimit_handlers.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(_create_timelimit_handlers, _MARK, True)
    AsynPool._create_timelimit_handlers = _create_timelimit_handlers  # type: ignore[attr-defined]


def unpatch() -> None:
    """Give ``AsynPool`` Celery's own per-job timers back (pools registered from now on)."""
    try:
        from celery.concurrency.asynpool import AsynPool
    except ImportError:  # pragma: no cover
        return
    current = AsynPool.__dict__["_create_timelimit_handlers"]
    if getattr(current, _MARK, False):
        AsynPool._create_timelimit_handlers = current.__wrapped__  # type: ignore[attr-defined]
