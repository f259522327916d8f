"""No pool process is forked while the reconciler runs code that takes locks.

The reconciler is a thread of the worker's main process, and that process forks the
prefork pool's processes (at start, and whenever one is lost or recycled). A child gets
a copy of every lock as it was at the fork, and none of the other threads: a lock the
reconciler's thread held at that instant (a module's import lock while a reconciler
imports its HTTP client, kombu's connection pool while it republishes, a lock of the
reader's own provider client) stays held in the child for ever, and the child's first
task that needs it hangs until its time limit. The crash-point sweep saw it twice: a
pool process forked while the reconciler made its first provider lookup hung 89 s before
its payment call, and its run expired with the payment's outcome unknown.

So the reconciler's calls into code it does not own (the effect reconcilers, the
republish through kombu) hold :func:`no_fork_meanwhile`, and every fork of the process
waits for it (``os.register_at_fork``): a pool process is replaced when the call ends.
The reconciler's own database statements are not held: a database outage must not stop
the pool from replacing its processes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: Reentrant: code run under it may itself fork (``subprocess`` with ``preexec_fn``).
_calls = threading.RLock()


def _before_fork() -> None:
    _calls.acquire()


def _after_fork() -> None:
    _calls.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)


@contextmanager
def no_fork_meanwhile() -> Iterator[None]:
    """While inside, a fork of this process (from any thread) waits."""
    with _calls:
        yield
