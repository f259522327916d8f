"""A prefork pool process's result pipe (celery_deadlines.core.resultpipes), on real pipes
read by Celery's own ``ResultHandler._recv_message`` and a fake event loop: a message
the loop had partly read when the process died is finished from the pipe; one the
process died in the middle of writing leaves the pipe unreadable, and its queues are
not handed to the replacement process; a message that cannot be unpickled is dropped."""

from __future__ import annotations

import logging
import os
import pickle
import struct
import subprocess
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from billiard import queues
from celery.concurrency.asynpool import ResultHandler

from celery_deadlines.core import resultpipes

MESSAGE = (2, ("job", 1, (True, "x" * 200_000)))  # a READY far longer than a pipe holds


class Hub:
    """kombu's hub as Celery's result reader uses it."""

    def __init__(self) -> None:
        self.readers: dict[int, tuple[Any, tuple[Any, ...]]] = {}

    def add_reader(self, fd: int, callback: Any, *args: Any) -> None:
        self.readers[fd] = (callback, args)

    def remove_reader(self, fd: int) -> None:
        self.readers.pop(fd, None)


@pytest.fixture(autouse=True)
def patched() -> Any:
    resultpipes.patch()
    yield
    resultpipes.unpatch()


def setup(alive: bool = False, pid: int = 0) -> tuple[Any, Any, Hub, list[Any]]:
    queue = queues._SimpleQueue(rnonblock=True)  # type: ignore[attr-defined]  # AsynPool's
    fd = queue._reader.fileno()
    hub = Hub()
    handler: Any = ResultHandler.__new__(ResultHandler)
    handler._hub = hub
    handler.handle_event = mock.Mock(name="handle_event")
    proc = SimpleNamespace(outqR_fd=fd, outq=queue, pid=pid, _is_alive=lambda: alive)
    handler.fileno_to_outq = {fd: proc}
    pool = SimpleNamespace(_result_handler=handler, _fileno_to_outq={fd: proc})
    return pool, proc, hub, []


def frame(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return struct.pack(">i", len(body)) + body


def begin(pool: Any, proc: Any, hub: Hub, got: list[Any], written: bytes) -> None:
    """The event loop reads what ``written`` put in the pipe, as Celery's
    ``on_result_readable`` does: a message begun is left to a generator on the hub."""
    write(proc, written)
    reader = pool._result_handler._recv_message(hub.add_reader, proc.outqR_fd, got.append)
    next(reader)  # reads what the pipe holds, then waits for the rest
    hub.add_reader(proc.outqR_fd, reader)


def write(proc: Any, data: bytes) -> None:
    os.write(proc.outq._writer.fileno(), data)


def test_a_message_partly_read_when_its_process_died_is_finished_from_the_pipe() -> None:
    pool, proc, hub, got = setup()
    whole = frame(MESSAGE)
    begin(pool, proc, hub, got, whole[:40_000])
    write(proc, whole[40_000:65_000])  # the rest, in the pipe when the process is reaped
    original = mock.Mock()
    # only a pipe this long fits at once: the test writes the rest while finishing
    with mock.patch.object(proc.outq._reader, "poll", side_effect=_feed(proc, whole[65_000:])):
        resultpipes._process_flush_queues(original, pool, proc)
    assert got == [MESSAGE]
    original.assert_called_once_with(pool, proc)  # then Celery's flush, from a boundary
    assert not getattr(proc, resultpipes._UNREADABLE, False)


def _feed(proc: Any, rest: bytes) -> Any:
    """``poll`` of the pipe while the test writes ``rest`` into it, a pipe's worth at a
    time (as a process that had written it all before it died would have)."""
    chunks = [rest[i : i + 60_000] for i in range(0, len(rest), 60_000)]

    def poll(timeout: float = 0.0) -> bool:
        if chunks:
            write(proc, chunks.pop(0))
            return True
        return False

    return poll


def test_a_message_its_process_died_writing_leaves_the_pipe_unreadable() -> None:
    pool, proc, hub, got = setup()
    begin(pool, proc, hub, got, frame(MESSAGE)[:30_000])  # killed in the middle of it
    original = mock.Mock()
    resultpipes._process_flush_queues(original, pool, proc)
    assert got == []
    original.assert_not_called()  # Celery's flush would read the pipe from the middle
    assert getattr(proc, resultpipes._UNREADABLE)

    # its queues are not handed to the replacement: new ones instead, closed after
    # Celery's on_process_down
    old, new = ("old queues",), ("new queues",)
    pool._queues = {old: proc}
    pool._find_worker_queues = lambda p: next(q for q, o in pool._queues.items() if o is p)
    pool.create_process_queues = lambda: new
    free = mock.Mock()
    resultpipes._process_cleanup_queues(free, pool, proc)
    free.assert_not_called()
    assert pool._queues == {new: None}

    down = mock.Mock()
    pool.destroy_queues = mock.Mock()

    def handlers(pool: Any, hub: Any) -> None:
        pool.on_process_down = down

    resultpipes._create_process_handlers(handlers, pool, hub)
    pool.on_process_down(proc)
    down.assert_called_once_with(proc)
    pool.destroy_queues.assert_called_once_with(old, proc)


def test_the_queues_of_a_process_whose_pipe_reads_well_are_handed_on() -> None:
    pool, proc, _, _ = setup()
    free = mock.Mock()
    resultpipes._process_cleanup_queues(free, pool, proc)
    free.assert_called_once_with(pool, proc)


def test_a_message_that_cannot_be_unpickled_is_dropped_and_its_process_killed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        pool, proc, hub, got = setup(alive=True, pid=child.pid)
        body = b"\x01(no pickle)"
        write(proc, struct.pack(">i", len(body)) + body)
        reader = pool._result_handler._recv_message(hub.add_reader, proc.outqR_fd, got.append)
        with (
            caplog.at_level(logging.ERROR, logger="celery_deadlines"),
            pytest.raises(StopIteration),  # and no exception out of the event loop
        ):
            next(reader)
        assert got == []
        assert "dropped a message from pool process" in caplog.text
        assert proc.outqR_fd not in hub.readers  # not read again
        assert getattr(proc, resultpipes._UNREADABLE)
        assert child.wait(timeout=5) == -9
    finally:
        child.kill()
        child.wait()


def test_celerys_own_reader_is_given_back() -> None:
    resultpipes.unpatch()
    assert not getattr(ResultHandler.__dict__["_recv_message"], resultpipes._MARK, False)
    resultpipes.patch()
    resultpipes.patch()  # once
    wrapped = ResultHandler.__dict__["_recv_message"]
    assert not getattr(wrapped.__wrapped__, resultpipes._MARK, False)


def test_a_pool_process_waits_for_its_messages_without_the_counts_lock() -> None:
    """A process killed while it held the count's lock (SIGKILL 0.1 s after the hard
    time limit's SIGTERM, as this wait reads the count again) leaves the lock taken for
    good: the wait no longer takes it, so that it cannot be killed holding it."""
    import threading

    import billiard
    from billiard.pool import Worker

    context: Any = billiard.get_context("fork")
    counter = context.Value("i")
    holder = context.Process(target=_hold, args=(counter,))
    holder.start()
    holder.join(5)  # it took the lock and was killed holding it
    assert holder.exitcode == -9
    assert not counter.get_lock().acquire(timeout=0.1)  # as the main process would find it

    counter.get_obj().value = 3  # the main process read all three messages
    ensure: Any = vars(Worker)["_ensure_messages_consumed"]
    answers: list[Any] = []
    waiting = threading.Thread(
        target=lambda: answers.append(ensure(SimpleNamespace(on_ready_counter=counter), 3)),
        daemon=True,  # Celery's own would wait on the lock for good
    )
    waiting.start()
    waiting.join(5)
    assert answers == [True]


def _hold(counter: Any) -> None:
    counter.get_lock().acquire()
    os.kill(os.getpid(), 9)
