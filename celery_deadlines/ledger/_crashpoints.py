"""Named crash points for the reliability tests (private; inert in production).

The library calls :func:`hit` at the instants where a crash is most interesting: after
the run's row is committed and before its message is published, after the claim, after
an effect's intent, after the dispatch guard, before and after an outcome is recorded,
after the run is completed, around a retry's publish, and in the reconciler between
reading an answer and writing it (the points are listed in :data:`POINTS`).

Nothing happens unless the process was *started* with the environment variable
``CELERY_DEADLINES_TESTING_CRASHPOINTS_FILE`` naming a plan: a JSON object mapping task
ids to ``{"point": name, "action": action}`` (or a list of them). It is read from the
environment, never from a message, so no message can crash a worker. Each planned crash
fires at most once per (task id, point), across all processes (an ``O_EXCL`` marker
file), and every firing is appended to ``<plan>.fired.jsonl`` before it acts, so a test
can prove that the crash it planned really happened.

Actions: ``kill`` (SIGKILL this process: a pool process dies mid-task), ``kill_worker``
(SIGKILL this process's group: the whole worker dies), ``stop:<seconds>`` (SIGSTOP this
process; a detached helper sends SIGCONT after the pause), ``wait:<path>`` (this thread
waits until the test creates ``path``, at most :data:`WAIT_LIMIT` seconds: one process,
or one thread of it such as a reconciler, is held at a point while others go on, so a
test can interleave them in the order it wants).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from typing import Final

PLAN_FILE_ENV: Final = "CELERY_DEADLINES_TESTING_CRASHPOINTS_FILE"

#: Every point the library calls, in the order a run meets them.
POINTS: Final = (
    "outbox.recorded",  # the run's row is committed, its message not yet published
    "outbox.published",  # published, the caller not yet told
    "claim.before",  # the message was received, the run not yet claimed
    "claim.after",  # the claim is committed, the body not yet started
    "effect.intent",  # the intent is recorded (a new dispatch is due), the guard not yet run
    "effect.dispatched",  # DISPATCHED committed, the external call not yet made
    "effect.before_outcome",  # the external call returned, its outcome not yet recorded
    "effect.recorded",  # the outcome is recorded, the run not yet completed
    "run.completed",  # the run's outcome is written, the broker not yet acked
    "retry.reserved",  # the retry is written to the ledger, its message not yet published
    "retry.published",  # the retry is published, the original message not yet acked
    "reconcile.answered",  # the reconciler has an answer for an UNKNOWN effect, unwritten
)

_plan_file: Final = os.environ.get(PLAN_FILE_ENV) or None

#: The longest a ``wait:<path>`` action holds its thread (a test that never releases it
#: must not hang the worker for ever).
WAIT_LIMIT: Final = 120.0


def hit(point: str, task_id: str | None) -> None:
    """Crash here if the plan says so for ``task_id`` (a no-op outside the tests)."""
    if _plan_file is None or task_id is None:
        return
    if point not in POINTS:  # a misspelt point would never fire: say so (tests only)
        raise ValueError(f"unknown crash point {point!r}; known: {', '.join(POINTS)}")
    _fire(_plan_file, point, task_id)


def _fire(plan_file: str, point: str, task_id: str) -> None:
    try:
        with open(plan_file) as plan:
            entries = json.load(plan).get(task_id) or []
    except FileNotFoundError:
        return
    for entry in entries if isinstance(entries, list) else [entries]:
        if entry.get("point") == point and _first_firing(plan_file, point, task_id):
            _record(plan_file, point, task_id, entry["action"])
            _act(entry["action"])


def _first_firing(plan_file: str, point: str, task_id: str) -> bool:
    digest = hashlib.sha256(f"{task_id}@{point}".encode()).hexdigest()[:16]
    try:
        os.close(os.open(f"{plan_file}.{digest}.fired", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _record(plan_file: str, point: str, task_id: str, action: str) -> None:
    line = json.dumps(
        {"task_id": task_id, "point": point, "action": action, "pid": os.getpid(), "t": time.time()}
    )
    fd = os.open(f"{plan_file}.fired.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _act(action: str) -> None:
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "kill_worker":
        os.killpg(os.getpgid(0), signal.SIGKILL)
    elif action.startswith("stop:"):
        seconds = float(action.removeprefix("stop:"))
        subprocess.Popen(
            ["sh", "-c", f"sleep {seconds}; kill -CONT {os.getpid()}"], start_new_session=True
        )
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action.startswith("wait:"):
        released = action.removeprefix("wait:")
        until = time.monotonic() + WAIT_LIMIT
        while not os.path.exists(released) and time.monotonic() < until:
            time.sleep(0.02)
    else:
        raise ValueError(f"unknown crash point action {action!r}")
