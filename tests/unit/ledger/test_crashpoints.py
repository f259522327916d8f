"""Crash points are inert unless a process starts with a plan, and fire once per plan."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from celery_deadlines.ledger import _crashpoints
from celery_deadlines.ledger._crashpoints import PLAN_FILE_ENV

REPO = Path(__file__).resolve().parents[3]
HIT = (
    "from celery_deadlines.ledger._crashpoints import hit\n"
    "hit('effect.dispatched', 'run-1')\n"
    "print('alive')"
)


def run_hit(plan: Path | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != PLAN_FILE_ENV}
    if plan is not None:
        env[PLAN_FILE_ENV] = str(plan)
    return subprocess.run(
        [sys.executable, "-c", HIT], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def test_without_a_plan_a_crash_point_does_nothing() -> None:
    assert _crashpoints._plan_file is None  # the test process itself has no plan
    done = run_hit(None)
    assert (done.returncode, done.stdout.strip()) == (0, "alive")


def test_a_planned_crash_kills_the_process_once_and_is_recorded(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"run-1": {"point": "effect.dispatched", "action": "kill"}}))
    first, second = run_hit(plan), run_hit(plan)
    assert first.returncode == -signal.SIGKILL
    assert (second.returncode, second.stdout.strip()) == (0, "alive")  # fired once only
    fired = [json.loads(line) for line in Path(f"{plan}.fired.jsonl").read_text().splitlines()]
    assert [(f["task_id"], f["point"], f["action"]) for f in fired] == [
        ("run-1", "effect.dispatched", "kill")
    ]


def test_a_plan_for_another_run_or_point_does_not_fire(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "run-2": {"point": "effect.dispatched", "action": "kill"},
                "run-1": [{"point": "claim.after", "action": "kill"}],
            }
        )
    )
    done = run_hit(plan)
    assert (done.returncode, done.stdout.strip()) == (0, "alive")


def test_a_wait_holds_the_process_until_the_test_releases_it(tmp_path: Path) -> None:
    plan, released = tmp_path / "plan.json", tmp_path / "go"
    plan.write_text(
        json.dumps({"run-1": {"point": "effect.dispatched", "action": f"wait:{released}"}})
    )
    env = {**os.environ, PLAN_FILE_ENV: str(plan)}
    process = subprocess.Popen(
        [sys.executable, "-c", HIT], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    fired = Path(f"{plan}.fired.jsonl")
    try:
        for _ in range(3000):  # polls the fired log, not the clock: the wait has begun
            if fired.exists() and fired.read_text():
                break
            subprocess.run(["sleep", "0.01"], check=True)
        assert process.poll() is None  # held at the point
        released.touch()
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert (process.returncode, out.strip()) == (0, "alive")
