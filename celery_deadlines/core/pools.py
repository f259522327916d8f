"""Whether this process runs its attempts one at a time.

A claim's owner is ``host:pid``. In a process that runs one attempt at a time, that name
tells its attempt from any other, and the ledger lets a won claim commit without
waiting for the disk: a database crash may take it back and the next claim may issue
its token again, but every later write names the owner with the token
(docs/explanation/run-ledger.md, "Claim: one compare-and-swap"). A prefork pool process runs
one task at a time on its main thread (Celery sends it ``worker_process_init``), and so does a
solo worker; a thread or greenlet pool, and any pool this module does not know, runs
several attempts under one pid, and its claims wait for the disk.

A worker's main process names the owner of an attempt it supervises (to end it at its
hard time limit) by the pid its pool reports for the job: a prefork pool process's own,
but on the thread and greenlet pools a thread's or greenlet's id, while their claims,
made in the worker's own process, name its pid (:func:`owner_pid`).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from celery.signals import worker_init, worker_process_init

_MARK = "celery_deadlines.core.pools"

#: Set in a prefork pool process and in a solo worker (never unset: a process does not
#: change pools).
_one_at_a_time = False
#: Set in a worker whose pool runs its jobs in the worker's own process (solo, threads,
#: gevent, eventlet): their claims name this process's pid.
_attempts_here = False
#: The modules of Celery's pools that run jobs in the worker's own process.
_IN_PROCESS = frozenset(
    {
        "celery.concurrency.solo",
        "celery.concurrency.thread",
        "celery.concurrency.gevent",
        "celery.concurrency.eventlet",
    }
)


def one_attempt_at_a_time() -> bool:
    """Whether the attempt claimed now, on this thread, is the only one its owner runs
    until it ends."""
    return _one_at_a_time and threading.current_thread() is threading.main_thread()


def owner_pid(reported: object) -> object:
    """The pid that the claim of a job its pool reported as ``reported`` (the request's
    ``worker_pid``) names in its owner: this process's own when the pool runs its jobs
    here, else the one reported (a prefork pool process's)."""
    return os.getpid() if _attempts_here else reported


def stopped_by_the_pool(exc: BaseException) -> bool:
    """Whether ``exc``, raised out of a body, is its green pool's hard time limit: gevent's
    or eventlet's ``Timeout``, which the pool raises in the job where it next yields and
    reports as the time limit when it reaches the pool. The run's end is the worker's to
    write then, at the limit, as for a prefork pool process killed at its limit
    (:mod:`celery_deadlines.core.request`); the attempt writes nothing of its own."""
    if not _attempts_here:
        return False
    for module in ("gevent", "eventlet"):
        timeout = getattr(sys.modules.get(module), "Timeout", None)
        if isinstance(timeout, type) and isinstance(exc, timeout):
            return True
    return False


def mark_attempts_here() -> None:
    """This worker's pool runs its jobs in this process (see :func:`owner_pid`)."""
    global _attempts_here
    _attempts_here = True


def mark_one_attempt_at_a_time() -> None:
    """This process runs its attempts one at a time, on its main thread."""
    global _one_at_a_time
    _one_at_a_time = True


def connect() -> None:
    """Mark a prefork pool process when it starts, and a solo worker (idempotent)."""
    worker_process_init.connect(_in_a_pool_process, dispatch_uid=_MARK, weak=False)
    worker_init.connect(_in_a_worker, dispatch_uid=_MARK, weak=False)


def _in_a_pool_process(**_: Any) -> None:
    mark_one_attempt_at_a_time()


def _in_a_worker(sender: Any = None, **_: Any) -> None:
    from celery.concurrency import get_implementation
    from celery.concurrency.solo import TaskPool as Solo

    named = getattr(sender, "pool_cls", None)
    if named is None:
        return
    try:
        pool = get_implementation(named)
    except Exception:  # noqa: BLE001 (a pool Celery cannot name: not known to run one at a time)
        return
    if not isinstance(pool, type):
        return
    if issubclass(pool, Solo):
        mark_one_attempt_at_a_time()
    if any(klass.__module__ in _IN_PROCESS for klass in pool.__mro__):
        mark_attempts_here()
