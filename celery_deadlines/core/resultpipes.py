"""A prefork pool process's result pipe can never stop the worker.

Each pool process of Celery's ``AsynPool`` writes its messages (``ACK``, ``READY`` with
the job's outcome, ``DEATH``) to a pipe of its own, each as a 4-byte length and a
pickle; the worker's main process reads them on its event loop, a message at a time,
with a generator that resumes as bytes arrive (``ResultHandler._recv_message``). A
message of more than the pipe's atomic size is not written at once: on Python 3.11 the
``READY`` of any job that raised (a failure, a retry, an ``Ignore``, such as a run the
attempt gate refuses) carries billiard's ``ExceptionInfo``, whose traceback holds the
instruction positions of Celery's ``trace_task``, about 50 KB.

billiard writes a message of more than 16 KB in two parts, its length and then its
body, and the main process, woken by the first, often reads the length alone. When the
pool process is killed while the main process has read only part of such a message
(the hard time limit, which the deadline's cap sets for every job of a DeadlineTask, is
due right as a job refused at the attempt gate, its deadline passed, sends its
outcome, and a busy main process applies it before it reads on), Celery drops
the partial read, reads the rest of the pipe from the middle of the message
(``process_flush_queues``), and hands the same pipe to the replacement process, whose
reader starts in the middle too. Its first "message" is a piece of the old one:
``pickle`` raises (``UnpicklingError``), the exception leaves the event loop and the
worker stops ("Unrecoverable error"; Celery's #2294 is the same crash). Plain Celery
does it too, with any task whose failures meet its hard time limit; the deadline's cap
makes it frequent.

:func:`patch` (a worker's main process, at ``worker_init``) changes three things, none
of which acts on a pipe that reads as Celery expects:

* when a pool process has exited, a message the event loop had partly read is finished
  from what is left in the pipe, before anything else reads it; one that cannot be (the
  process died in the middle of writing it) leaves the pipe unreadable;
* a pipe left unreadable is not handed to the replacement process: its queues are
  replaced by new ones, as Celery does for a job it was writing to a process that died
  (``on_partial_read``), and closed once Celery is done with the process;
* a message that cannot be unpickled is logged and dropped, its pipe is unreadable from
  then on, and a process still alive on it is killed (a job it was running is lost, as
  when a pool process dies): never an exception out of the event loop.

And one in the pool processes (patched before they fork): billiard's wait, in a pool
process on its way out, until the main process has read every message it sent
(``Worker._ensure_messages_consumed``) reads the main process's count of them without
the count's lock. A process given SIGTERM at its hard time limit waits there, reading
the count every 0.1 s, and Celery sends SIGKILL 0.1 s after SIGTERM: killed while it
held the lock, it left the main process blocked on it for good at the next message it
read (``on_ready``), a worker frozen, no error logged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
from inspect import isgenerator
from types import SimpleNamespace
from typing import IO, Any, Final

from celery.signals import worker_init

logger = logging.getLogger("celery_deadlines")

#: Set on each patched function, so that :func:`patch` wraps Celery's own only once.
_MARK: Final = "_celery_deadlines_result_pipes"
#: A pool process's attribute: its result pipe lost a message's boundary.
_UNREADABLE: Final = "_celery_deadlines_unreadable_pipe"
#: A pool process's attribute: the queues taken from it, closed after ``on_process_down``.
_RETIRED: Final = "_celery_deadlines_retired_queues"


def connect() -> None:
    """Patch ``AsynPool`` in a worker's main process when it starts (idempotent)."""
    worker_init.connect(_on_worker_init, dispatch_uid=_MARK, weak=False)


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    patch()


def patch() -> None:
    """Wrap ``ResultHandler._recv_message`` and ``AsynPool``'s flush, queue cleanup and
    process handlers (once per process; nothing where the prefork pool cannot be
    imported)."""
    try:
        from billiard.pool import Worker
        from celery.concurrency.asynpool import AsynPool, ResultHandler
    except ImportError:  # pragma: no cover - a platform without the prefork pool
        return
    _wrap(ResultHandler, "_recv_message", _recv_message)
    _wrap(AsynPool, "process_flush_queues", _process_flush_queues)
    _wrap(AsynPool, "_process_cleanup_queues", _process_cleanup_queues)
    _wrap(AsynPool, "_create_process_handlers", _create_process_handlers)
    _wrap(Worker, "_ensure_messages_consumed", _ensure_messages_consumed)


def unpatch() -> None:
    """Give ``AsynPool`` and its ``ResultHandler`` Celery's own methods back."""
    try:
        from billiard.pool import Worker
        from celery.concurrency.asynpool import AsynPool, ResultHandler
    except ImportError:  # pragma: no cover
        return
    for owner, name in (
        (ResultHandler, "_recv_message"),
        (AsynPool, "process_flush_queues"),
        (AsynPool, "_process_cleanup_queues"),
        (AsynPool, "_create_process_handlers"),
        (Worker, "_ensure_messages_consumed"),
    ):
        current = owner.__dict__.get(name)
        if getattr(current, _MARK, False):
            setattr(owner, name, current.__wrapped__)  # type: ignore[union-attr]


def _wrap(owner: type, name: str, wrapper: Any) -> None:
    original = owner.__dict__.get(name)
    if original is None:  # a Celery or billiard without it: its own behaviour stands
        logger.debug("%s.%s not found: not patched", owner.__name__, name)
        return
    if getattr(original, _MARK, False):
        return

    def patched(*args: Any, **kwargs: Any) -> Any:
        return wrapper(original, *args, **kwargs)

    patched.__wrapped__ = original  # type: ignore[attr-defined]
    patched.__name__ = name
    setattr(patched, _MARK, True)
    setattr(owner, name, patched)


# -- reading a message -----------------------------------------------------------------


def _recv_message(
    original: Any, handler: Any, add_reader: Any, fd: int, callback: Any, *args: Any, **kwargs: Any
) -> Any:
    """Celery's reader of one message from ``fd``, whose unpickling cannot raise."""
    if not args and "load" not in kwargs:

        def load(buffer: IO[bytes]) -> Any:
            return _load(handler, fd, buffer)

        kwargs["load"] = load
    return original(handler, add_reader, fd, callback, *args, **kwargs)


def _load(handler: Any, fd: int, buffer: IO[bytes]) -> Any:
    """The message in ``buffer``; ``None`` (which Celery's reader passes over) for one
    that cannot be unpickled, whose pipe is unreadable from then on."""
    try:
        return pickle.load(buffer)
    except Exception as exc:  # noqa: BLE001 - pickle raises UnpicklingError, EOFError, KeyError, ...
        proc = getattr(handler, "fileno_to_outq", {}).get(fd)
        logger.error(
            "dropped a message from pool process %s that cannot be read (%r): its result "
            "pipe lost a message's boundary; the process is replaced and its pipe with it",
            getattr(proc, "pid", None),
            exc,
        )
        hub = getattr(handler, "_hub", None)
        if hub is not None:
            hub.remove_reader(fd)  # Celery's reader put itself back before unpickling
        if proc is not None:
            _unreadable(proc)
            _kill(proc)
        return None


def _kill(proc: Any) -> None:
    """Kill a pool process whose messages can no longer be read (its job is lost)."""
    pid = getattr(proc, "pid", None)
    if not pid or not proc._is_alive():
        return
    with contextlib.suppress(OSError):  # already gone
        os.kill(pid, signal.SIGKILL)


def _unreadable(proc: Any) -> None:
    setattr(proc, _UNREADABLE, True)


# -- a pool process that has exited ------------------------------------------------------


def _process_flush_queues(original: Any, pool: Any, proc: Any) -> Any:
    """Celery's flush of ``proc``'s pipe, after the message the event loop had partly
    read is finished; none when it cannot be, or when the pipe is unreadable."""
    if not _alive(proc) and not _finish_partial_read(pool, proc):
        _unreadable(proc)
    if getattr(proc, _UNREADABLE, False):
        return None
    try:
        return original(pool, proc)
    except Exception as exc:  # noqa: BLE001 - a message that cannot be unpickled (Celery catches only OSError)
        logger.error(
            "dropped what is left in the result pipe of pool process %s, which cannot be "
            "read (%r); the pipe is not used again",
            getattr(proc, "pid", None),
            exc,
        )
        _unreadable(proc)
        return None


def _alive(proc: Any) -> bool:
    try:
        return bool(proc._is_alive())
    except Exception:  # noqa: BLE001 - no process to ask: not alive
        return False


def _finish_partial_read(pool: Any, proc: Any) -> bool:
    """Finish the message the event loop had partly read from the pipe of ``proc`` (which
    has exited) from the bytes left in the pipe: ``True`` when there was none or it is
    finished (and handled, as Celery's reader handles it), ``False`` when the pipe ends
    before it does."""
    handler = getattr(pool, "_result_handler", None)
    hub = getattr(handler, "_hub", None)
    fd = getattr(proc, "outqR_fd", None)
    outq: Any = getattr(proc, "outq", None)
    if hub is None or fd is None or outq is None:
        return True
    if getattr(pool, "_fileno_to_outq", {}).get(fd) is not proc:
        return True  # the descriptor is another process's now
    registered = hub.readers.get(fd)
    reader = registered[0] if registered else None
    if not isgenerator(reader):
        return True  # no message begun
    try:
        pipe = outq._reader
        while True:
            try:
                next(reader)
            except StopIteration:
                return True
            if not pipe.poll(0):
                return False  # the process died before it wrote the rest
    except Exception:  # noqa: BLE001 - EOF, a closed pipe: the message cannot be finished
        return False


def _process_cleanup_queues(original: Any, pool: Any, proc: Any) -> Any:
    """Celery's: ``proc``'s queues are free for its replacement; an unreadable pipe's are
    replaced by new ones instead (closed after ``on_process_down``)."""
    if not getattr(proc, _UNREADABLE, False) or getattr(proc, "dead", False):
        return original(pool, proc)
    try:
        queues = pool._find_worker_queues(proc)
    except ValueError:
        return original(pool, proc)
    del pool._queues[queues]
    pool._queues[pool.create_process_queues()] = None
    setattr(proc, _RETIRED, queues)
    return None


def _create_process_handlers(original: Any, pool: Any, hub: Any) -> Any:
    """Celery's handlers, with ``on_process_down`` closing the queues taken from an
    unreadable pipe's process once it has forgotten them."""
    result = original(pool, hub)
    on_process_down = pool.on_process_down

    def on_process_down_then_close(proc: Any) -> Any:
        try:
            return on_process_down(proc)
        finally:
            queues = getattr(proc, _RETIRED, None)
            if queues is not None:
                setattr(proc, _RETIRED, None)
                try:
                    pool.destroy_queues(queues, proc)
                except Exception:  # closing what is left must not stop the worker either
                    logger.exception("closing the queues of pool process %s failed", proc.pid)

    pool.on_process_down = on_process_down_then_close
    return result


# -- a pool process on its way out ---------------------------------------------------------


class _Unlocked:
    """A shared count read without its lock (one word: a read sees a whole value)."""

    __slots__ = ("_raw",)

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    @property
    def value(self) -> int:
        return int(self._raw.value)


def _ensure_messages_consumed(original: Any, worker: Any, completed: int) -> Any:
    """billiard's wait until the main process has read this process's messages, the main
    process's count read without taking its lock (which only the main process, which
    writes the count, still takes)."""
    counter = getattr(worker, "on_ready_counter", None)
    get_obj = getattr(counter, "get_obj", None)
    if get_obj is None:
        return original(worker, completed)
    return original(SimpleNamespace(on_ready_counter=_Unlocked(get_obj())), completed)
