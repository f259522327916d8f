"""``core/cancelling``: a cancel that terminates a body (a task's ``cancel_terminates``),
raised in the body's own thread where it next runs Python code, never between an
effect's dispatch and its outcome, never once the body has ended; and a cancel without
the ledger, Celery's revoke."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_deadlines.core.cancelling import (
    TerminatedByCancel,
    Termination,
    cancel,
    terminable,
    termination_for,
)
from celery_deadlines.errors import ConfigurationError

PATIENCE = 10.0


def body_in_a_thread(
    work: Any,
) -> tuple[threading.Thread, list[str], threading.Event, list[Termination]]:
    """Run ``work(termination, notes)`` as a terminable body on a thread of its own."""
    notes: list[str] = []
    ready = threading.Event()
    made: list[Termination] = []

    def run() -> None:
        termination = Termination(threading.get_ident())
        made.append(termination)
        try:
            terminable(termination, work, termination, notes, ready)
        except TerminatedByCancel:
            notes.append("terminated")
        notes.append("after the body")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(PATIENCE)
    return thread, notes, ready, made


def busy(termination: Termination, notes: list[str], ready: threading.Event) -> None:
    ready.set()
    until = time.monotonic() + PATIENCE
    while time.monotonic() < until:
        time.sleep(0.005)
    notes.append("ran to its end")


def test_a_cancel_terminates_a_running_body_in_its_own_thread() -> None:
    thread, notes, _, (termination,) = body_in_a_thread(busy)
    termination.cancel_learnt()
    thread.join(PATIENCE)
    assert notes == ["terminated", "after the body"]


def test_a_cancel_learnt_during_an_effects_dispatch_terminates_the_body_after_its_outcome() -> None:
    learnt = threading.Event()

    def dispatching(termination: Termination, notes: list[str], ready: threading.Event) -> None:
        termination.effect_begins()
        ready.set()
        assert learnt.wait(PATIENCE)
        time.sleep(0.05)  # the cancel is not raised while the effect is being dispatched
        notes.append("outcome written")
        termination.effect_ended()
        notes.append("went on after the effect")

    thread, notes, _, (termination,) = body_in_a_thread(dispatching)
    termination.cancel_learnt()
    learnt.set()
    thread.join(PATIENCE)
    assert notes == ["outcome written", "terminated", "after the body"]


def test_a_body_that_has_ended_is_never_terminated() -> None:
    def quick(termination: Termination, notes: list[str], ready: threading.Event) -> None:
        ready.set()
        notes.append("returned")

    thread, notes, _, (termination,) = body_in_a_thread(quick)
    thread.join(PATIENCE)
    termination.cancel_learnt()
    time.sleep(0.05)
    assert notes == ["returned", "after the body"]


@pytest.mark.parametrize(
    ("declares", "eager", "terminable_here"),
    [(True, False, True), (False, False, False), (True, True, False)],
)
def test_only_a_workers_body_of_a_task_that_declares_it_is_terminable(
    declares: bool, eager: bool, terminable_here: bool
) -> None:
    task = SimpleNamespace(cancel_terminates=declares)
    request = SimpleNamespace(is_eager=eager)
    assert (termination_for(task, request) is not None) is terminable_here


def test_without_the_ledger_a_cancel_is_celerys_revoke_of_the_one_message(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    app = Celery("no-ledger", set_as_current=False)
    app.conf.deadlines_ledger = False  # as without celery_deadlines in INSTALLED_APPS
    revoked: list[tuple[Any, ...]] = []
    monkeypatch.setattr(app.control, "revoke", lambda *args, **kw: revoked.append((args, kw)))
    with caplog.at_level("WARNING", logger="celery_deadlines"):  # whatever a test left
        assert cancel("checkout-1", reason="customer left", app=app) == 1
    assert revoked == [(("checkout-1",), {})]
    assert "without the run ledger a cancel is Celery's revoke" in caplog.text
    with pytest.raises(ConfigurationError, match="needs the run ledger"):
        cancel("checkout-1", at=datetime.now(UTC), app=app)
    assert len(revoked) == 1


#: A process that terminates one body, then counts the lines of a traced loop (as a
#: coverage tool or a debugger would trace them) on its main thread.
AFTER_A_TERMINATION = """
import sys, threading
from tests.unit.core.test_cancelling import body_in_a_thread, busy

thread, notes, _, (termination,) = body_in_a_thread(busy)
termination.cancel_learnt()
thread.join(10)
assert notes == ["terminated", "after the body"], notes
lines = 0

def counting(frame, event, arg):
    global lines
    lines += 1
    return counting

def loop():
    total = 0
    for number in range(100_000):
        total += number
    return total

sys.settrace(counting)
loop()
sys.settrace(None)
print("traced", lines)
"""


def test_a_terminated_body_leaves_the_processs_other_threads_running_as_before() -> None:
    # a withdrawn asynchronous exception left CPython < 3.13 signalled for good: every
    # thread then took the interpreter's slow path at every check, and a traced loop
    # of a moment ran for minutes
    done = subprocess.run(
        [sys.executable, "-c", AFTER_A_TERMINATION],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("traced"), done.stdout
