"""django-celery-beat's rows and the library's zoned schedules in one real ``celery beat
-S celery_deadlines.contrib.django_celery_beat:DatabaseDeadlineScheduler``, with a real
worker, Redis and PostgreSQL (the ledger and django-celery-beat's tables in one database,
as a Django project has them).

A row "every second, expire_seconds N" saved as the admin saves it is published once per
occurrence, as the run ``<row>:UTC@<second>`` with the deadline ``second + N``; beat
killed and restarted, or two beats at once, neither lose nor double one, and those whose
window closed while no beat ran are recorded ``EXPIRED`` / ``missed_occurrence``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.test import override_settings
from django_celery_beat.models import (  # type: ignore[import-untyped]
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
)

from celery_deadlines.models import Run, Status
from tests.integration.conftest import LEDGER_DB, ended, ledger_database_url
from tests.support.processes import Transport, kill_group, read_log, spawn, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("postgres"),
    pytest.mark.django_db(transaction=True, databases=[LEDGER_DB]),
]

SCHEDULER = "celery_deadlines.contrib.django_celery_beat:DatabaseDeadlineScheduler"
ZONE = "Europe/Berlin"
ROW = "every-second"
SECOND = timedelta(seconds=1)


class BeatTablesOnTheLedgerDatabase:
    """This process saves django-celery-beat's rows where the beat reads them (the ledger's
    PostgreSQL database), the change marker the admin's save writes included."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return LEDGER_DB if model._meta.app_label == "django_celery_beat" else None

    db_for_write = db_for_read


def save_row(name: str, every: int, expire_seconds: int, **fields: Any) -> None:
    """Save a PeriodicTask as the admin does: ``l.report`` every ``every`` seconds."""
    router = f"{__name__}.{BeatTablesOnTheLedgerDatabase.__name__}"
    with override_settings(DATABASE_ROUTERS=[router]):
        interval, _ = IntervalSchedule.objects.get_or_create(every=every, period="seconds")
        PeriodicTask.objects.create(
            name=name, task="l.report", interval=interval, expire_seconds=expire_seconds,
            **fields,
        )  # fmt: skip


def save_cron_row(name: str, expire_seconds: int, **fields: Any) -> None:
    """Save a PeriodicTask as the admin does: ``l.report`` every minute (a UTC crontab)."""
    router = f"{__name__}.{BeatTablesOnTheLedgerDatabase.__name__}"
    with override_settings(DATABASE_ROUTERS=[router]):
        every_minute, _ = CrontabSchedule.objects.get_or_create(
            minute="*", hour="*", day_of_week="*", day_of_month="*", month_of_year="*",
            timezone="UTC",
        )  # fmt: skip
        PeriodicTask.objects.create(
            name=name, task="l.report", crontab=every_minute, expire_seconds=expire_seconds,
            **fields,
        )  # fmt: skip


class DatabaseBeat:
    """One ``celery beat`` subprocess with django-celery-beat's scheduler and the library's."""

    def __init__(self, transport: Transport, queue: str, folder: Path, env: dict[str, str]):
        self.log_path = folder / "beat.log"
        self.started_at = datetime.now(UTC)
        self.process = spawn(
            [
                "-A", "tests.support.ledgerapp", "beat", "-S", SCHEDULER,
                "-s", str(folder / "celerybeat-schedule"), "--max-interval", "1", "-l", "INFO",
            ],
            transport, queue, env, self.log_path, "ab",
        )  # fmt: skip

    def log(self) -> str:
        return read_log(self.log_path)

    def kill(self) -> datetime:
        """SIGKILL (no shutdown, no sync of its rows); when it was dead for certain."""
        kill_group(self.process)
        return datetime.now(UTC)


@pytest.fixture
def database_beat(
    redis_broker: Transport, queue: str, sink: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., DatabaseBeat]]:
    started: list[DatabaseBeat] = []

    def start(**env: str) -> DatabaseBeat:
        folder = tmp_path / f"beat-{len(started)}"
        folder.mkdir()
        beat = DatabaseBeat(
            redis_broker, queue, folder,
            {
                "TEST_DATABASE_URL": ledger_database_url(),
                "TEST_SINK": str(sink),
                "DJANGO_SETTINGS_MODULE": "tests.support.dcb_settings",
                **env,
            },
        )  # fmt: skip
        started.append(beat)
        wait_for(lambda: "beat: Starting..." in beat.log(), 30)
        return beat

    yield start
    for beat in started:
        beat.kill()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for beat in started:
            print(f"--- {beat.log_path} ---\n{beat.log()}")


def row_runs(name: str = ROW) -> list[Run]:
    return list(Run.objects.using(LEDGER_DB).filter(schedule=name).order_by("not_before"))


def executions(sink: Path) -> dict[str, int]:
    """How many times each run id's body ran (the task's own sink: one line a run)."""
    counts: dict[str, int] = {}
    if sink.exists():
        for line in filter(None, sink.read_text().splitlines()):
            entry = json.loads(line)
            if entry["kind"] == "effect":
                counts[entry["key"]] = counts.get(entry["key"], 0) + 1
    return counts


def all_ended(name: str = ROW) -> list[Run] | None:
    runs = row_runs(name)
    return runs if runs and all(run.is_terminal for run in runs) else None


def occurrence_of(run: Run) -> datetime:
    """The instant of the occurrence the run is (every run of a row has one)."""
    assert run.not_before is not None, f"{run.task_id} has no occurrence instant"
    return run.not_before


def assert_each_second_once(runs: list[Run], sink: Path, window: timedelta) -> None:
    """From the first occurrence to the last, every second has exactly one run, named by
    its second, with its window; no body ran twice, and none of a run no worker claimed
    (a missed one, or one expired waiting) ran. An occurrence published with the last
    moments of its window left may be claimed (the reserve is 0) and cut at its deadline
    by the capped hard time limit: EXPIRED ``deadline_passed``, its body run at most once
    (docs/explanation/failure-semantics.md, "the attempt runs past the deadline")."""
    instants = [occurrence_of(run) for run in runs]
    first = instants[0]
    assert instants == [first + SECOND * k for k in range(len(runs))]  # none lost
    assert first.microsecond == 0  # on the grid
    ran = executions(sink)
    for run in runs:
        local = occurrence_of(run).astimezone(UTC).replace(tzinfo=None).isoformat()
        assert run.task_id == f"{ROW}:UTC@{local}"
        assert run.deadline == occurrence_of(run) + window
        assert run.status in (Status.SUCCEEDED, Status.EXPIRED), run
        executed = ran.get(run.task_id, 0)
        if run.status == Status.SUCCEEDED:
            assert executed == 1, run
        elif run.attempt == 0:
            assert executed == 0, run  # never claimed: never run
        else:
            assert run.reason == "deadline_passed", run
            assert run.detail.startswith("hard time limit"), (run, run.detail)
            assert executed <= 1, run


def test_a_zoned_entry_and_an_admin_row_run_side_by_side_under_the_database_scheduler(
    redis_broker: Transport, ledger_worker: Any, sink: Path, database_beat: Any
) -> None:
    ledger_worker(redis_broker)
    # the zoned entry: daily at a local time a few seconds from now, in Berlin
    at = (datetime.now(UTC) + timedelta(seconds=5)).replace(microsecond=0)
    local = at.astimezone(ZoneInfo(ZONE)).replace(tzinfo=None)
    zoned_id = f"zoned:{ZONE}@{local.isoformat()}"
    beat = database_beat(
        TEST_BEAT_AT=local.time().isoformat(), TEST_BEAT_ZONE=ZONE, TEST_BEAT_WINDOW="60",
        TEST_BEAT_NAME="zoned",
    )  # fmt: skip
    save_row(ROW, every=1, expire_seconds=10)  # while beat runs, as an operator would
    zoned = wait_for(lambda: ended(zoned_id), 40)
    wait_for(lambda: sum(run.status == Status.SUCCEEDED for run in row_runs()) >= 3, 30)
    beat.kill()
    assert (zoned.status, zoned.not_before, zoned.deadline) == (
        Status.SUCCEEDED, at, at + timedelta(seconds=60),
    )  # fmt: skip
    assert executions(sink)[zoned_id] == 1
    # the zoned entry stayed in beat's memory: the table holds only the admin's row
    names = PeriodicTask.objects.using(LEDGER_DB).values_list("name", flat=True)
    assert "zoned" not in names
    assert ROW in names
    assert "Cannot convert schedule type" not in beat.log()
    assert_each_second_once(wait_for(all_ended, 30), sink, timedelta(seconds=10))


def test_a_killed_and_restarted_beat_neither_loses_nor_doubles_a_rows_occurrence(
    redis_broker: Transport, ledger_worker: Any, sink: Path, database_beat: Any
) -> None:
    window = timedelta(seconds=2)
    ledger_worker(redis_broker)
    save_row(ROW, every=1, expire_seconds=2)
    first = database_beat()
    wait_for(lambda: len(row_runs()) >= 2, 30)
    killed_at = first.kill()  # its rows' last_run_at is not written
    # down for longer than the window: at least one occurrence is missed for certain
    wait_for(lambda: datetime.now(UTC) > killed_at + window + 2 * SECOND, 10)
    restarted = database_beat()
    # its first reconciliation (the backlog: missed and due occurrences) ends with this
    # line; a beat slow to start publishes occurrences after its spawn in that pass, so
    # the runs alone do not say it has ended
    wait_for(lambda: "occurrences reconciled through" in restarted.log(), 30)
    wait_for(lambda: any(run.not_before > restarted.started_at + SECOND for run in row_runs()), 30)
    restarted.kill()
    runs = wait_for(all_ended, 30)
    assert_each_second_once(runs, sink, window)
    # whatever fell while no beat ran, and whose window closed before the restarted one
    # started, is recorded missed (and never ran): nothing in between was forgotten
    down = [
        run for run in runs if killed_at < run.not_before and run.deadline < restarted.started_at
    ]
    assert down, "the outage was longer than the window"
    for run in down:
        assert (run.status, run.reason) == (Status.EXPIRED, "missed_occurrence"), run
        assert "was not published before its window closed" in run.detail


def test_two_beats_at_once_publish_each_of_a_rows_occurrences_once(
    redis_broker: Transport, ledger_worker: Any, sink: Path, database_beat: Any
) -> None:
    window = timedelta(seconds=10)
    ledger_worker(redis_broker)
    save_row(ROW, every=1, expire_seconds=10)
    beats = [database_beat(), database_beat()]
    both = max(beat.started_at for beat in beats)
    wait_for(lambda: any(run.not_before > both + 3 * SECOND for run in row_runs()), 30)
    for beat in beats:
        beat.kill()
    assert_each_second_once(wait_for(all_ended, 30), sink, window)
    assert all(run.status == Status.SUCCEEDED for run in row_runs())


def test_a_68_year_cron_row_is_refused_once_when_read_and_the_other_rows_keep_their_times(
    redis_broker: Transport, ledger_worker: Any, sink: Path, database_beat: Any
) -> None:
    window = timedelta(seconds=10)
    ledger_worker(redis_broker)
    # a crontab row with the longest window the admin takes, as beat left it last time
    # (last_run_at written: the window, not the row's save, bounds the look back)
    ran_before = datetime.now(UTC) - timedelta(hours=1)
    save_cron_row("forever", expire_seconds=2_147_483_647, last_run_at=ran_before)
    save_row(ROW, every=1, expire_seconds=10)
    beat = database_beat()
    # the crontab's next minute comes: that occurrence is on record, refused, never run
    refused = wait_for(lambda: row_runs("forever"), 75)
    wait_for(lambda: any(run.not_before > refused[0].not_before for run in row_runs()), 30)
    beat.kill()
    [first] = refused
    assert first.task_id == f"forever:UTC@{occurrence_of(first).replace(tzinfo=None).isoformat()}"
    assert (first.status, first.reason) == (Status.EXPIRED, "missed_occurrence")
    assert first.detail.endswith(
        "was not published: its window of 2147483647 s (expire_seconds) is longer than "
        "deadlines_max_budget (604800 s)"
    )
    assert executions(sink).get(first.task_id, 0) == 0
    # said when the row was read, once, though beat looked at the row again and again
    assert beat.log().count("longer than deadlines_max_budget (604800 s), so none") == 1
    assert "Couldn't apply scheduled task forever" not in beat.log()
    # the other row kept its times: every second published in its window, and run
    runs = wait_for(all_ended, 30)
    assert_each_second_once(runs, sink, window)
    assert occurrence_of(runs[0]) < beat.started_at + 10 * SECOND
    assert occurrence_of(runs[-1]) > occurrence_of(first)
    assert all(run.reason != "missed_occurrence" for run in runs)


def test_a_rows_headers_never_set_its_messages_id_task_or_deadline(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path, database_beat: Any
) -> None:
    window = timedelta(seconds=10)
    tasks = ledger_client(redis_broker)
    ledger_worker(redis_broker)
    victim = tasks.effect.apply_async(("victim",), budget=30)
    victim.get(timeout=30)
    before = wait_for(lambda: ended(victim.id), 10)
    # anyone who may edit a PeriodicTask in the admin writes these headers
    later = (datetime.now(UTC) + timedelta(days=6)).timestamp()
    hostile = {
        "id": victim.id, "task": "l.effect", "root_id": victim.id, "parent_id": victim.id,
        "x_deadline": later, "x_delivery_deadline": later, "team": "ops",
    }  # fmt: skip
    save_row(ROW, every=1, expire_seconds=10, headers=json.dumps(hostile))
    beat = database_beat()
    wait_for(lambda: sum(run.status == Status.SUCCEEDED for run in row_runs()) >= 3, 30)
    beat.kill()
    runs = wait_for(all_ended, 30)
    # each occurrence ran once, under its own id, as the row's task, within its window
    assert_each_second_once(runs, sink, window)
    assert all(run.task_name == "l.report" for run in runs)
    assert all(run.delivery_deadline is None for run in runs)
    # the other run was not touched: one attempt, one execution, as it ended
    after = Run.objects.using(LEDGER_DB).get(task_id=victim.id)
    assert (after.status, after.attempt, after.version) == (
        before.status, before.attempt, before.version,
    )  # fmt: skip
    assert executions(sink)["victim"] == 1
    assert "header(s) 'id', 'parent_id', 'root_id', 'task', 'x_deadline', " in beat.log()
