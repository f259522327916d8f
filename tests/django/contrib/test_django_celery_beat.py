"""django-celery-beat's rows of DeadlineTasks under ``DatabaseDeadlineScheduler``
through beat's own scheduler loop: each occurrence published once as its run id, with
its window, after a restart, beside a second beat, across an outage and an edit (its
table on SQLite, the ledger on either database).

Skipped where django-celery-beat is not installed: the matrix's newest Django, which
django-celery-beat does not support yet (it requires ``Django<6.1``); the main
interpreter's run installs it and runs these.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

pytest.importorskip("django_celery_beat", reason="django-celery-beat is not installed")

from celery import Celery
from django_celery_beat.models import (  # type: ignore[import-untyped]
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
)

from celery_deadlines.beat import ZonedSchedule
from celery_deadlines.clock import get_clock
from celery_deadlines.contrib.django_celery_beat import DatabaseDeadlineScheduler
from celery_deadlines.models import Status
from celery_deadlines.testing import FakeClock, use_clock
from tests.django.test_beat import (
    DIGEST,
    QUEUE,
    WEDNESDAY_0900,
    WEDNESDAY_ID,
    app_for,
    published,
    run_beat,
    runs,
)
from tests.support.memory_queue import drain

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgres"])


@pytest.fixture
def app(alias: str) -> Iterator[Celery]:
    app = app_for(alias)
    drain(app, QUEUE)
    yield app
    drain(app, QUEUE)


#: django-celery-beat's table is on ``default`` (SQLite), the ledger on either database
beside_the_table = pytest.mark.parametrize(
    "alias",
    [
        pytest.param("default", id="sqlite", marks=pytest.mark.django_db(transaction=True)),
        pytest.param(
            "postgres",
            id="postgresql",
            marks=pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
        ),
    ],
    indirect=True,
)
HOUR = timedelta(hours=1)
#: Wednesday 09:00 Berlin is 07:00:00 UTC: on every interval's epoch grid
POLL_0700 = "poll:UTC@2026-08-19T07:00:00"
POLL_0701 = "poll:UTC@2026-08-19T07:01:00"


@pytest.fixture
def database_beat(app: Celery) -> Iterator[Callable[..., DatabaseDeadlineScheduler]]:
    """Start django-celery-beat's scheduler with the library's, as ``celery beat -S``
    would (``beat_schedule`` from keyword arguments); a new one is a restarted beat."""
    started: list[DatabaseDeadlineScheduler] = []

    def start(**beat_schedule: dict[str, Any]) -> DatabaseDeadlineScheduler:
        app.conf.beat_schedule = beat_schedule
        scheduler = DatabaseDeadlineScheduler(app=app, lazy=False)
        started.append(scheduler)
        return scheduler

    yield start
    for scheduler in started:
        scheduler.sync()
        scheduler._finalize.cancel()  # its sync at exit would find no test database


def row(
    name: str, task: str, every: int, saved_at: datetime = WEDNESDAY_0900 - HOUR, **fields: Any
) -> Any:
    """A PeriodicTask row as the admin saves it at ``saved_at``: every ``every`` seconds."""
    interval, _ = IntervalSchedule.objects.get_or_create(every=every, period="seconds")
    saved = PeriodicTask.objects.create(name=name, task=task, interval=interval, **fields)
    PeriodicTask.objects.filter(pk=saved.pk).update(date_changed=saved_at)  # (auto_now)
    return saved


@beside_the_table
def test_a_zoned_entry_beside_database_rows_stays_out_of_the_table_and_runs_by_occurrence(
    app: Celery, database_beat: Callable[..., DatabaseDeadlineScheduler]
) -> None:
    # django-celery-beat's own scheduler cannot hold it: "Cannot convert schedule type
    # <ZonedSchedule ...> to model", and the entry is dropped
    row("poll", "shop.send_digest", 60, expire_seconds=30)
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=3))) as clock:
        scheduler = database_beat(
            digest={"task": "shop.send_digest", "schedule": ZonedSchedule(DIGEST)}
        )
        run_beat(scheduler, clock, 10)
    assert sorted(published(app)) == [WEDNESDAY_ID, POLL_0700]
    assert list(PeriodicTask.objects.values_list("name", flat=True)) == ["poll"]
    assert runs(app)[WEDNESDAY_ID].deadline == WEDNESDAY_0900 + timedelta(minutes=15)


@beside_the_table
def test_an_admin_row_of_a_deadline_task_is_published_by_occurrence_with_its_window(
    app: Celery, database_beat: Callable[..., DatabaseDeadlineScheduler]
) -> None:
    row("poll", "shop.send_digest", 60, expire_seconds=30, kwargs="{}")
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=3))) as clock:
        scheduler = database_beat()
        run_beat(scheduler, clock, 2)
        assert published(app) == []  # not yet
        run_beat(scheduler, clock, 65)
    assert published(app) == [POLL_0700, POLL_0701]  # each once, on the grid
    recorded = runs(app)
    assert list(recorded) == [POLL_0700, POLL_0701]
    first = recorded[POLL_0700]
    assert (first.not_before, first.deadline) == (
        WEDNESDAY_0900, WEDNESDAY_0900 + timedelta(seconds=30),
    )  # fmt: skip
    assert (first.schedule, first.schedule_zone, first.schedule_local) == (
        "poll", "UTC", "2026-08-19T07:00:00",
    )  # fmt: skip
    scheduler.sync()  # (every beat_sync_every publishes or 3 minutes, and at shutdown)
    assert PeriodicTask.objects.get(name="poll").total_run_count == 2  # the admin's count


@beside_the_table
def test_a_row_saved_just_after_beat_started_is_published_without_waiting_five_minutes(
    app: Celery, database_beat: Callable[..., DatabaseDeadlineScheduler]
) -> None:
    # django-celery-beat alone misses it: its first look at the change stamp reads a
    # change made after its initial read as no change (until its five-minute full sync)
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=3))) as clock:
        scheduler = database_beat()  # the initial read: no rows yet
        row("poll", "shop.send_digest", 60, expire_seconds=30, kwargs="{}")
        run_beat(scheduler, clock, 5)
    assert published(app) == [POLL_0700]


def counted(monkeypatch: pytest.MonkeyPatch, name: str) -> list[None]:
    """One item per call of the scheduler's method ``name`` from now on."""
    calls: list[None] = []
    method = getattr(DatabaseDeadlineScheduler, name)

    def counting(self: DatabaseDeadlineScheduler, *args: Any, **kwargs: Any) -> Any:
        calls.append(None)
        return method(self, *args, **kwargs)

    monkeypatch.setattr(DatabaseDeadlineScheduler, name, counting)
    return calls


@beside_the_table
def test_the_rows_a_scheduler_writes_at_start_are_no_change_to_sync_and_read_again(
    app: Celery,
    database_beat: Callable[..., DatabaseDeadlineScheduler],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # django-celery-beat's own scheduler tests (make beat-compat) count the syncs: its
    # startup write of celery.backend_cleanup and the beat_schedule rows counted as a
    # change, and it synced and read the table once more at every start
    monkeypatch.setitem(app.conf, "result_expires", timedelta(days=1))  # Celery's default
    syncs, reads = counted(monkeypatch, "sync"), counted(monkeypatch, "all_as_schedule")
    scheduler = database_beat(poll={"task": "shop.send_digest", "schedule": 60.0})
    names = set(PeriodicTask.objects.values_list("name", flat=True))
    assert names == {"celery.backend_cleanup", "poll"}  # written, and in its schedule
    assert {"celery.backend_cleanup", "poll"} <= set(scheduler.schedule)
    assert (len(syncs), len(reads)) == (1, 1)  # the initial read alone


@beside_the_table
def test_a_row_another_writer_saves_while_a_scheduler_starts_is_still_a_change(
    app: Celery,
    database_beat: Callable[..., DatabaseDeadlineScheduler],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # its own writes are taken as read only when nobody else wrote since its initial read
    install = DatabaseDeadlineScheduler.install_default_entries

    def installing_beside_an_admin(self: DatabaseDeadlineScheduler, data: Any) -> None:
        row("poll", "shop.send_digest", 60, expire_seconds=30, kwargs="{}")
        install(self, data)

    monkeypatch.setattr(
        DatabaseDeadlineScheduler, "install_default_entries", installing_beside_an_admin
    )
    scheduler = database_beat()
    assert "poll" in scheduler.schedule  # its next look reads the table again


@beside_the_table
def test_a_row_another_writer_saves_as_a_scheduler_writes_its_own_is_still_a_change(
    app: Celery,
    database_beat: Callable[..., DatabaseDeadlineScheduler],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the stamp its own writes moved was taken as read, an operator's row saved between
    # them with it: beat ran it only at its five-minute full sync
    entry = DatabaseDeadlineScheduler.Entry
    own = entry.from_entry.__func__

    def writing_beside_an_admin(cls: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        written = own(cls, name, *args, **kwargs)
        if name == "nightly":  # saved now, as the admin saves it (auto_now)
            now = get_clock().now()
            row("poll", "shop.send_digest", 60, now, expire_seconds=30, kwargs="{}")
        return written

    monkeypatch.setattr(entry, "from_entry", classmethod(writing_beside_an_admin))
    scheduler = database_beat(nightly={"task": "shop.send_digest", "schedule": 86400.0})
    assert {"nightly", "poll"} <= set(scheduler.schedule)  # its next look reads the table


@beside_the_table
def test_a_rows_published_message_carries_its_run_id_deadline_and_row_name(
    app: Celery, database_beat: Callable[..., DatabaseDeadlineScheduler]
) -> None:
    row("poll", "shop.send_digest", 60, expire_seconds=30, headers='{"team": "ops"}')
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=1))) as clock:
        run_beat(database_beat(), clock, 3)
    [message] = [m["headers"] for m in drain(app, QUEUE)]
    assert message["id"] == POLL_0700
    assert (message["periodic_task_name"], message["team"]) == ("poll", "ops")
    assert message["x_deadline"] == (WEDNESDAY_0900 + timedelta(seconds=30)).timestamp()


@beside_the_table
def test_a_rows_window_is_its_tasks_budget_when_the_row_sets_no_expire_seconds(
    app: Celery, database_beat: Callable[..., DatabaseDeadlineScheduler]
) -> None:
    row("poll", "shop.budgeted", 60)
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=1))) as clock:
        run_beat(database_beat(), clock, 3)
    assert published(app) == [POLL_0700]
    assert runs(app)[POLL_0700].deadline == WEDNESDAY_0900 + timedelta(seconds=20)


@beside_the_table
def test_a_restarted_database_scheduler_that_lost_last_run_at_publishes_no_occurrence_twice(
    app: Celery, database_beat: Callable[..., DatabaseDeadlineScheduler]
) -> None:
    row("poll", "shop.send_digest", 60, expire_seconds=30)
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=1))) as clock:
        run_beat(database_beat(), clock, 3)
        assert published(app) == [POLL_0700]
        # killed before it wrote last_run_at (or it was edited away), then restarted
        PeriodicTask.objects.filter(name="poll").update(last_run_at=None, total_run_count=0)
        run_beat(database_beat(), clock, 20)
    assert published(app) == []
    assert list(runs(app)) == [POLL_0700]


@beside_the_table
def test_two_database_schedulers_at_once_publish_each_row_occurrence_once(
    app: Celery, database_beat: Callable[..., DatabaseDeadlineScheduler]
) -> None:
    row("poll", "shop.send_digest", 60, expire_seconds=30)
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=2))) as clock:
        run_beat(database_beat(), clock, 65, database_beat())
    assert published(app) == [POLL_0700, POLL_0701]


@beside_the_table
def test_row_occurrences_whose_window_closed_while_beat_was_down_are_recorded_missed(
    app: Celery, database_beat: Callable[..., DatabaseDeadlineScheduler]
) -> None:
    row("poll", "shop.send_digest", 60, expire_seconds=30)
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=1))) as clock:
        run_beat(database_beat(), clock, 3)
    assert published(app) == [POLL_0700]
    # down from 07:00:02 to 07:03:45: the windows of 07:01, 07:02 and 07:03 closed
    with use_clock(FakeClock(WEDNESDAY_0900 + timedelta(minutes=3, seconds=45))) as clock:
        run_beat(database_beat(), clock, 5)
    assert published(app) == []  # not run late
    recorded = runs(app)
    assert list(recorded)[1:] == [f"poll:UTC@2026-08-19T07:0{m}:00" for m in (1, 2, 3)]
    for missed in list(recorded.values())[1:]:
        assert (missed.status, missed.reason) == (Status.EXPIRED, "missed_occurrence")
        assert missed.not_before is not None
        assert missed.deadline == missed.not_before + timedelta(seconds=30)
        assert "poll: occurrence" in missed.detail


@beside_the_table
def test_a_new_row_has_no_occurrence_from_before_it_was_saved(
    app: Celery, database_beat: Callable[..., DatabaseDeadlineScheduler]
) -> None:
    # saved at 07:00:10: 07:00:00 is still within a 30 s window, but the row did not exist
    row("poll", "shop.send_digest", 60, WEDNESDAY_0900 + timedelta(seconds=10), expire_seconds=30)
    with use_clock(FakeClock(WEDNESDAY_0900 + timedelta(seconds=12))) as clock:
        scheduler = database_beat()
        run_beat(scheduler, clock, 5)
        assert (published(app), runs(app)) == ([], {})
        run_beat(scheduler, clock, 50)
    assert published(app) == [POLL_0701]


@beside_the_table
def test_a_rows_schedule_edited_as_beat_runs_counts_its_occurrences_from_the_edit(
    app: Celery, database_beat: Callable[..., DatabaseDeadlineScheduler]
) -> None:
    row("poll", "shop.send_digest", 3600, expire_seconds=30)  # hourly: 07:00
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=1))) as clock:
        scheduler = database_beat()
        run_beat(scheduler, clock, 3)
        assert published(app) == [POLL_0700]
        clock.advance(10 * 60 - 2)  # 07:10: the admin makes it every minute
        edited = PeriodicTask.objects.get(name="poll")
        edited.interval, _ = IntervalSchedule.objects.get_or_create(every=60, period="seconds")
        edited.save()
        PeriodicTask.objects.filter(pk=edited.pk).update(date_changed=clock.now())
        run_beat(scheduler, clock, 65)
    # 07:01 to 07:10 are not "missed": the row said hourly then
    assert published(app) == ["poll:UTC@2026-08-19T07:11:00"]
    assert list(runs(app)) == [POLL_0700, "poll:UTC@2026-08-19T07:11:00"]


@beside_the_table
def test_a_row_of_a_plain_task_is_published_as_django_celery_beat_publishes_it(
    app: Celery, database_beat: Callable[..., DatabaseDeadlineScheduler]
) -> None:
    # due now by django-celery-beat's own reading (last run long ago, on the real clock)
    row("plain", "shop.plain", 60, last_run_at=datetime(2020, 1, 1, tzinfo=UTC))
    with use_clock(FakeClock(WEDNESDAY_0900)) as clock:
        run_beat(database_beat(), clock, 2)
    [message] = [m["headers"] for m in drain(app, QUEUE)]
    assert (message["task"], message["periodic_task_name"]) == ("shop.plain", "plain")
    assert ":" not in message["id"]  # Celery's own id: no occurrence
    assert runs(app) == {}


@beside_the_table
def test_a_deadline_tasks_row_without_a_window_is_published_as_before_and_says_why(
    app: Celery,
    database_beat: Callable[..., DatabaseDeadlineScheduler],
    caplog: pytest.LogCaptureFixture,
) -> None:
    row("nowindow", "shop.send_digest", 60, last_run_at=datetime(2020, 1, 1, tzinfo=UTC))
    with use_clock(FakeClock(WEDNESDAY_0900)) as clock:
        run_beat(database_beat(), clock, 2)
    [message] = [m["headers"] for m in drain(app, QUEUE)]
    assert ":" not in message["id"]
    assert "'nowindow': it has no expire_seconds and its task no budget" in caplog.text
    assert [run.schedule for run in runs(app).values()] == [None]


def cron_row(
    name: str, task: str, saved_at: datetime = WEDNESDAY_0900 - HOUR, **fields: Any
) -> Any:
    """A PeriodicTask row "every minute" (a crontab, UTC) as the admin saves it."""
    every_minute, _ = CrontabSchedule.objects.get_or_create(
        minute="*", hour="*", day_of_week="*", day_of_month="*", month_of_year="*",
        timezone="UTC",
    )  # fmt: skip
    saved = PeriodicTask.objects.create(name=name, task=task, crontab=every_minute, **fields)
    PeriodicTask.objects.filter(pk=saved.pk).update(date_changed=saved_at)  # (auto_now)
    return saved


#: a row's headers naming what only Celery and the library may say: another run's id,
#: another task, a later deadline
HOSTILE_HEADERS = {
    "id": "another-run", "task": "shop.plain", "root_id": "another-run",
    "parent_id": "another-run", "shadow": "shop.plain", "retries": 7,
    "x_deadline": (WEDNESDAY_0900 + timedelta(days=6)).timestamp(),
    "x_delivery_deadline": (WEDNESDAY_0900 + timedelta(days=6)).timestamp(),
    "team": "ops",
}  # fmt: skip


@beside_the_table
def test_a_rows_headers_never_set_its_messages_id_task_or_deadline(
    app: Celery,
    database_beat: Callable[..., DatabaseDeadlineScheduler],
    caplog: pytest.LogCaptureFixture,
) -> None:
    row("poll", "shop.send_digest", 60, expire_seconds=30, headers=json.dumps(HOSTILE_HEADERS))
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=1))) as clock:
        run_beat(database_beat(), clock, 62)
    first, second = [m["headers"] for m in drain(app, QUEUE)]
    assert [first["id"], second["id"]] == [POLL_0700, POLL_0701]
    for message, at in ((first, WEDNESDAY_0900), (second, WEDNESDAY_0900 + timedelta(minutes=1))):
        assert (message["task"], message["shadow"], message["retries"]) == (
            "shop.send_digest", None, 0,
        )  # fmt: skip
        assert message["root_id"] == message["id"]
        assert message["parent_id"] is None
        assert message["x_deadline"] == (at + timedelta(seconds=30)).timestamp()
        assert "x_delivery_deadline" not in message
        assert (message["periodic_task_name"], message["team"]) == ("poll", "ops")  # kept
    assert list(runs(app)) == [POLL_0700, POLL_0701]
    said = [r.getMessage() for r in caplog.records if "are not sent" in r.getMessage()]
    assert said == [
        "periodic task 'poll': its header(s) 'id', 'parent_id', 'retries', 'root_id', "
        "'shadow', 'task', 'x_deadline', 'x_delivery_deadline' are not sent: the "
        "message's id, task and deadline are beat's and the row's to say"
    ]  # once, though the row was read at each of its two publishes


@beside_the_table
def test_a_plain_rows_headers_never_set_its_messages_id_or_task(
    app: Celery, database_beat: Callable[..., DatabaseDeadlineScheduler]
) -> None:
    row("plain", "shop.plain", 60, last_run_at=datetime(2020, 1, 1, tzinfo=UTC),
        headers='{"id": "another-run", "task": "shop.send_digest", "team": "ops"}')  # fmt: skip
    with use_clock(FakeClock(WEDNESDAY_0900)) as clock:
        run_beat(database_beat(), clock, 2)
    [message] = [m["headers"] for m in drain(app, QUEUE)]
    assert (message["task"], message["team"]) == ("shop.plain", "ops")
    assert message["id"] != "another-run"
    assert message["root_id"] == message["id"]


@beside_the_table
def test_a_row_whose_window_is_longer_than_the_maximum_budget_is_refused_when_read(
    app: Celery,
    database_beat: Callable[..., DatabaseDeadlineScheduler],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # eight days: one more than deadlines_max_budget, the longest any deadline may be
    cron_row("long", "shop.send_digest", expire_seconds=8 * 24 * 3600)
    row("poll", "shop.send_digest", 60, expire_seconds=30)
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=1))) as clock:
        run_beat(database_beat(), clock, 3 * 60)
    # the other row keeps its times: each of its occurrences published, none missed
    published_ids = published(app)
    assert published_ids == [f"poll:UTC@2026-08-19T07:0{m}:00" for m in (0, 1, 2)]
    # each of the refused row's occurrences is on record, never published, saying why
    refused = [run for run in runs(app).values() if run.schedule == "long"]
    assert [run.task_id for run in refused] == [
        f"long:UTC@2026-08-19T07:0{m}:00" for m in (0, 1, 2)
    ]
    for run in refused:
        assert (run.status, run.reason) == (Status.EXPIRED, "missed_occurrence")
        assert run.deadline == run.not_before  # no window was given
        assert run.detail.endswith(
            "was not published: its window of 691200 s (expire_seconds) is longer than "
            "deadlines_max_budget (604800 s)"
        )
    said = [
        r
        for r in caplog.records
        if "longer than deadlines_max_budget (604800 s), so" in r.getMessage()
    ]
    assert len(said) == 1  # when the row was read, not at every look
    assert said[0].levelname == "WARNING"
    assert "'long'" in said[0].getMessage()


@beside_the_table
@pytest.mark.parametrize(
    "headers",
    ["[1]", '"ops"', "null", '{"__type__": "uuid", "__value__": "x"}', "{not json"],
    ids=["list", "string", "null", "kombu-type", "not-json"],
)
def test_a_row_whose_headers_are_not_a_json_object_is_left_out_and_the_others_run(
    app: Celery,
    database_beat: Callable[..., DatabaseDeadlineScheduler],
    caplog: pytest.LogCaptureFixture,
    headers: str,
) -> None:
    row("broken", "shop.send_digest", 60, expire_seconds=30, headers=headers)
    row("poll", "shop.send_digest", 60, expire_seconds=30)
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=1))) as clock:
        run_beat(database_beat(), clock, 3)
    assert published(app) == [POLL_0700]
    assert "periodic task 'broken' is not scheduled: its headers are not a JSON object" in (
        caplog.text
    )
