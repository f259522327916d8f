"""Seed 001's "scheduler restarts at a boundary" row with real processes: ``celery beat``
with the library's scheduler, a real worker, Redis and PostgreSQL.

The schedule is "daily at <a few seconds from now> Europe/Berlin". Beat is SIGKILLed on
either side of the occurrence and started again; the ledger and the task's own sink
(one line per execution) must show the occurrence exactly once, as its run id.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from celery_deadlines.models import Run, Status
from tests.integration.conftest import LEDGER_DB, ended, ledger_database_url
from tests.support.processes import BeatProcess, Transport, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("postgres"),
    pytest.mark.django_db(transaction=True, databases=[LEDGER_DB]),
]

ZONE = "Europe/Berlin"
WINDOW = 60


def occurrence_in(seconds: float) -> tuple[datetime, str, str]:
    """A local wall time ``seconds`` from now in Berlin: (UTC instant, HH:MM:SS, run id)."""
    at = (datetime.now(UTC) + timedelta(seconds=seconds)).replace(microsecond=0)
    local = at.astimezone(ZoneInfo(ZONE)).replace(tzinfo=None)
    return at, local.time().isoformat(), f"report:{ZONE}@{local.isoformat()}"


@pytest.fixture
def beat(
    redis_broker: Transport, queue: str, sink: Path, tmp_path: Path
) -> Iterator[Callable[[str], BeatProcess]]:
    started: list[BeatProcess] = []

    def start(at: str) -> BeatProcess:
        process = BeatProcess(
            redis_broker, queue, tmp_path / f"beat-{len(started)}.log",
            state_path=tmp_path / "celerybeat-schedule",
            extra_env={
                "TEST_DATABASE_URL": ledger_database_url(),
                "TEST_SINK": str(sink),
                "DJANGO_SETTINGS_MODULE": "tests.support.ledger_settings",
                "TEST_BEAT_AT": at, "TEST_BEAT_ZONE": ZONE, "TEST_BEAT_WINDOW": str(WINDOW),
            },
        )  # fmt: skip
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.kill()


def executions(sink: Path, run_id: str) -> int:
    if not sink.exists():
        return 0
    found = [json.loads(line) for line in sink.read_text().splitlines() if line]
    return sum(1 for line in found if line["kind"] == "effect" and line["key"] == run_id)


def scheduled_runs() -> list[str]:
    return list(Run.objects.using(LEDGER_DB).filter(schedule="report").values_list(
        "task_id", flat=True))  # fmt: skip


def test_a_beat_killed_right_after_publishing_does_not_publish_the_occurrence_again(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path, beat: Any
) -> None:
    ledger_client(redis_broker)
    # beat may be killed between recording the run and publishing it (the outbox's
    # window): the workers' sweeper then publishes it, here after 2 s
    ledger_worker(redis_broker, TEST_REPUBLISH_AFTER="2")
    at, local, run_id = occurrence_in(4)
    first = beat(local)
    wait_for(lambda: run_id in scheduled_runs(), 20)
    first.kill()  # its state file may not say it ran, its message may not be sent
    restarted = beat(local)
    wait_for(lambda: "occurrences reconciled through" in restarted.log(), 20)
    run = wait_for(lambda: ended(run_id), 30)
    assert (run.status, run.attempt) == (Status.SUCCEEDED, 1)
    assert ": 0 published" in restarted.log()  # the ledger knew it ran
    assert scheduled_runs() == [run_id]
    assert executions(sink, run_id) == 1
    assert (run.not_before, run.deadline) == (at, at + timedelta(seconds=WINDOW))
    assert (run.schedule_zone, run.schedule_local) == (ZONE, run_id.split("@")[1])


def test_a_beat_down_across_the_boundary_publishes_the_occurrence_once_when_it_returns(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path, beat: Any
) -> None:
    ledger_client(redis_broker)
    ledger_worker(redis_broker)
    at, local, run_id = occurrence_in(4)
    beat(local).kill()  # before the boundary
    wait_for(lambda: datetime.now(UTC) > at + timedelta(seconds=1), 10)
    assert scheduled_runs() == []  # nothing was published while it was down
    restarted = beat(local)
    run = wait_for(lambda: ended(run_id), 30)
    assert run.status == Status.SUCCEEDED
    assert ": 1 published" in restarted.log()
    assert scheduled_runs() == [run_id]
    assert executions(sink, run_id) == 1
