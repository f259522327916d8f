"""A fork waits while the reconciler runs code that takes locks (ledger/forks.py)."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import types
from pathlib import Path

import pytest

from celery_deadlines.ledger.forks import no_fork_meanwhile


def test_a_fork_waits_until_the_reconcilers_call_ends_and_the_child_can_take_the_guard() -> None:
    order: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def reconciler_call() -> None:
        with no_fork_meanwhile():
            inside.set()
            release.wait(30)
            order.append("call ended")

    def fork() -> None:
        pid = os.fork()
        if pid == 0:  # the child: the guard is free here, as every lock the call took
            with no_fork_meanwhile():
                os._exit(0)
        order.append("forked")
        _, status = os.waitpid(pid, 0)
        order.append(f"child exited {os.waitstatus_to_exitcode(status)}")

    call = threading.Thread(target=reconciler_call)
    call.start()
    assert inside.wait(30)
    forker = threading.Thread(target=fork)
    forker.start()
    forker.join(0.2)  # the fork's chance to happen early: it must not
    assert forker.is_alive()
    assert order == []
    release.set()
    call.join(30)
    forker.join(30)
    assert order == ["call ended", "forked", "child exited 0"]


def test_a_child_forked_during_a_reconcilers_first_import_can_import_it_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The crash sweep's hang: the reconciler's first provider lookup imported the HTTP
    # client while the pool forked a process; the child inherited the module's import
    # lock held, and its own first import of that module waited for ever.
    gate = types.ModuleType("fork_gate")
    gate.inside, gate.release = threading.Event(), threading.Event()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fork_gate", gate)
    (tmp_path / "slow_client.py").write_text(
        "import fork_gate\nfork_gate.inside.set()\nfork_gate.release.wait(30)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_client", raising=False)

    def reconciler_call() -> None:
        with no_fork_meanwhile():
            importlib.import_module("slow_client")

    call = threading.Thread(target=reconciler_call)
    call.start()
    assert gate.inside.wait(30)
    child: list[int] = []

    def fork() -> None:
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)  # a hung child is killed, and the test says so
            importlib.import_module("slow_client")
            os._exit(0)
        child.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))

    forker = threading.Thread(target=fork)
    forker.start()
    gate.release.set()
    call.join(30)
    forker.join(30)
    assert child == [0], "the child hung importing what the reconciler was importing"
