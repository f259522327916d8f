"""Timezone-true schedules through Celery beat's own scheduler loop, on SQLite and
PostgreSQL: each occurrence is published once as its run id, with its window; after a
restart or an outage the ledger, not beat's state file, says what was done
(django-celery-beat's rows: tests/django/contrib/test_django_celery_beat.py).

Beat's ``tick()`` runs for real; its clock is the library's (a :class:`FakeClock`), and
the broker is kombu's in-memory transport.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

import celery_deadlines
from celery_deadlines import DeadlineTask
from celery_deadlines.beat import DeadlineScheduler, ZonedSchedule
from celery_deadlines.explain import facts, render_text
from celery_deadlines.ledger.reconcile import reconcile_once
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.models import Run, Status
from celery_deadlines.rules.schedules import WEEKDAYS, LocalSchedule
from celery_deadlines.testing import FakeClock, use_clock
from tests.support.memory_queue import drain

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgres"])

QUEUE = "beat"
DIGEST = LocalSchedule(time(9, 0), "Europe/Berlin", timedelta(minutes=15), WEEKDAYS, "digest")
NIGHTLY = LocalSchedule(time(2, 30), "Europe/Berlin", timedelta(minutes=20), name="nightly")
#: Wednesday 19 August 2026, 09:00 in Berlin (CEST, UTC+2)
WEDNESDAY_0900 = datetime(2026, 8, 19, 7, 0, tzinfo=UTC)
WEDNESDAY_ID = "digest:Europe/Berlin@2026-08-19T09:00:00"

_apps: dict[str, Celery] = {}


def app_for(alias: str) -> Celery:
    if alias not in _apps:
        app = _apps[alias] = Celery(f"beat-{alias}", broker="memory://", backend="cache+memory://")
        app.conf.update(task_default_queue=QUEUE, deadlines_ledger=True, deadlines_database=alias)
        # (no result expiry: django-celery-beat would add a cleanup row of its own)
        app.conf.result_expires = None
        app.task(base=DeadlineTask, name="shop.send_digest")(send_digest)
        app.task(base=DeadlineTask, name="shop.budgeted", budget=20)(budgeted)
        app.task(name="shop.plain")(plain)
    return _apps[alias]


def send_digest() -> str:
    return "sent"


def plain() -> str:
    return "plain"


def budgeted() -> str:
    return "within 20 s"


@pytest.fixture
def app(alias: str) -> Iterator[Celery]:
    app = app_for(alias)
    drain(app, QUEUE)
    yield app
    drain(app, QUEUE)


def beat(app: Celery, state: Path, *entries: tuple[str, LocalSchedule]) -> DeadlineScheduler:
    """A beat scheduler with its own state file (a new file: beat's state lost)."""
    app.conf.beat_schedule = {
        name: {"task": "shop.send_digest", "schedule": ZonedSchedule(local)}
        for name, local in entries
    }
    return DeadlineScheduler(app=app, schedule_filename=str(state), lazy=False)


def run_beat(scheduler: Any, clock: FakeClock, seconds: float, *others: Any) -> None:
    """Let beat's loop run for ``seconds`` of the fake clock, a second at a time (with
    ``others``: several beats at once, each taking its turn every second)."""
    for _ in range(int(seconds)):
        for each in (scheduler, *others):
            while each.tick() == 0:
                pass
        clock.advance(1)


def published(app: Celery) -> list[str]:
    return [message["headers"]["id"] for message in drain(app, QUEUE)]


def runs(app: Celery) -> dict[str, Run]:
    alias = app.conf.deadlines_database
    return {run.task_id: run for run in Run.objects.using(alias).order_by("id")}


def test_an_occurrence_is_published_once_as_its_run_id_with_its_window(
    app: Celery, tmp_path: Path
) -> None:
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=3))) as clock:
        scheduler = beat(app, tmp_path / "beat", ("digest", DIGEST))
        run_beat(scheduler, clock, 2)
        assert published(app) == []  # not yet
        run_beat(scheduler, clock, 60)
    assert published(app) == [WEDNESDAY_ID]
    run = runs(app)[WEDNESDAY_ID]
    assert run.not_before == WEDNESDAY_0900
    assert run.deadline == WEDNESDAY_0900 + timedelta(minutes=15)
    assert (run.schedule, run.schedule_zone, run.schedule_local) == (
        "digest", "Europe/Berlin", "2026-08-19T09:00:00",
    )  # fmt: skip
    told = render_text(facts(run, events=[], database_now=WEDNESDAY_0900))
    assert (
        "  occurrence         digest: 2026-08-19T09:00:00 Europe/Berlin = "
        "2026-08-19T07:00:00.000Z, window until 2026-08-19T07:15:00.000Z"
    ) in told


def test_a_restarted_scheduler_reconciles_by_run_id_and_publishes_nothing_twice(
    app: Celery, tmp_path: Path
) -> None:
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=1))) as clock:
        run_beat(beat(app, tmp_path / "first", ("digest", DIGEST)), clock, 3)
        assert published(app) == [WEDNESDAY_ID]
        # killed right after the boundary, restarted with its state file lost
        run_beat(beat(app, tmp_path / "second", ("digest", DIGEST)), clock, 30)
    assert published(app) == []
    assert list(runs(app)) == [WEDNESDAY_ID]


def test_a_cancelled_occurrence_does_not_cancel_its_schedule(app: Celery, tmp_path: Path) -> None:
    """A cancel ends one run, the occurrence's: the next occurrence is published as
    usual, and neither this beat nor a restarted one publishes the cancelled one again."""
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=1))) as clock:
        scheduler = beat(app, tmp_path / "beat", ("digest", DIGEST))
        run_beat(scheduler, clock, 3)
        assert published(app) == [WEDNESDAY_ID]
        assert celery_deadlines.cancel(WEDNESDAY_ID, reason="bad digest", app=app) == 1

        clock.advance((timedelta(days=1) - timedelta(seconds=5)).total_seconds())  # 08:59:58
        run_beat(scheduler, clock, 5)
        run_beat(beat(app, tmp_path / "restarted", ("digest", DIGEST)), clock, 5)
    thursday_id = "digest:Europe/Berlin@2026-08-20T09:00:00"
    assert published(app) == [thursday_id]
    cancelled, thursday = runs(app)[WEDNESDAY_ID], runs(app)[thursday_id]
    assert cancelled.reason == "cancelled"
    assert (thursday.status, thursday.reason, thursday.schedule) == (
        Status.QUEUED, "", "digest",
    )  # fmt: skip


def test_a_scheduler_down_at_the_boundary_publishes_the_occurrence_late_in_its_window(
    app: Celery, tmp_path: Path
) -> None:
    with use_clock(FakeClock(WEDNESDAY_0900 + timedelta(minutes=5))) as clock:
        run_beat(beat(app, tmp_path / "beat", ("digest", DIGEST)), clock, 2)
    assert published(app) == [WEDNESDAY_ID]
    assert runs(app)[WEDNESDAY_ID].deadline == WEDNESDAY_0900 + timedelta(minutes=15)


def test_occurrences_whose_window_closed_during_an_outage_are_recorded_missed_not_run(
    app: Celery, tmp_path: Path
) -> None:
    monday = "digest:Europe/Berlin@2026-08-17T09:00:00"
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(days=2, seconds=1))) as clock:
        run_beat(beat(app, tmp_path / "beat", ("digest", DIGEST)), clock, 3)
    assert published(app) == [monday]
    # the scheduler is down from Monday until Wednesday 09:20, after the window closed
    with use_clock(FakeClock(WEDNESDAY_0900 + timedelta(minutes=20))) as clock:
        run_beat(beat(app, tmp_path / "beat", ("digest", DIGEST)), clock, 2)
    assert published(app) == []  # the stale backlog is not run late
    recorded = runs(app)
    assert list(recorded) == [monday, "digest:Europe/Berlin@2026-08-18T09:00:00", WEDNESDAY_ID]
    for missed in list(recorded.values())[1:]:
        assert (missed.status, missed.reason) == (Status.EXPIRED, "missed_occurrence")
        assert "was not published before its window closed" in missed.detail


def test_a_schedule_the_ledger_has_never_seen_records_nothing_before_it_as_missed(
    app: Celery, tmp_path: Path
) -> None:
    with use_clock(FakeClock(WEDNESDAY_0900 + timedelta(minutes=20))) as clock:
        run_beat(beat(app, tmp_path / "beat", ("digest", DIGEST)), clock, 2)
    assert (published(app), runs(app)) == ([], {})


def test_a_local_time_skipped_by_the_spring_transition_runs_once_shifted(
    app: Celery, tmp_path: Path
) -> None:
    # 29 March 2026: Berlin's clocks jump from 02:00 to 03:00; 02:30 does not exist
    at = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)  # 02:30 at the old offset: 03:30 CEST
    with use_clock(FakeClock(at - timedelta(seconds=2))) as clock:
        run_beat(beat(app, tmp_path / "beat", ("nightly", NIGHTLY)), clock, 3600)
    assert published(app) == ["nightly:Europe/Berlin@2026-03-29T02:30:00"]
    assert runs(app)["nightly:Europe/Berlin@2026-03-29T02:30:00"].not_before == at


def test_a_local_time_repeated_by_the_autumn_transition_runs_once_at_its_first(
    app: Celery, tmp_path: Path
) -> None:
    # 25 October 2026: Berlin's clocks fall back from 03:00 to 02:00; 02:30 happens twice
    first = datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # 02:30 CEST
    with use_clock(FakeClock(first - timedelta(seconds=2))) as clock:
        scheduler = beat(app, tmp_path / "beat", ("nightly", NIGHTLY))
        run_beat(scheduler, clock, 2 * 3600)  # through the second 02:30 (CET) as well
    assert published(app) == ["nightly:Europe/Berlin@2026-10-25T02:30:00"]
    assert runs(app)["nightly:Europe/Berlin@2026-10-25T02:30:00"].not_before == first


def test_a_zoned_schedule_on_a_plain_task_is_refused_with_the_fix(
    app: Celery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app.conf.beat_schedule = {"plain": {"task": "shop.plain", "schedule": ZonedSchedule(DIGEST)}}
    scheduler = DeadlineScheduler(app=app, schedule_filename=str(tmp_path / "b"), lazy=False)
    with use_clock(FakeClock(WEDNESDAY_0900)):
        scheduler.tick()
    assert "a ZonedSchedule needs a DeadlineTask" in caplog.text
    assert published(app) == []


def test_a_catch_up_shorter_than_the_window_or_an_unnamed_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="at least the schedule's window"):
        ZonedSchedule(DIGEST, catch_up=60)
    with pytest.raises(ValueError, match="needs a name"):
        ZonedSchedule(LocalSchedule(time(9), "Europe/Berlin", timedelta(minutes=5)))


def test_an_occurrence_whose_publish_fails_is_kept_and_published_by_the_sweeper(
    app: Celery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broker_down(*args: object, **kwargs: object) -> None:
        raise ConnectionError("broker unreachable")

    monkeypatch.setattr(app.amqp, "send_task_message", broker_down)
    with use_clock(FakeClock(WEDNESDAY_0900 - timedelta(seconds=1))) as clock:
        run_beat(beat(app, tmp_path / "beat", ("digest", DIGEST)), clock, 3)
    assert published(app) == []
    assert runs(app)[WEDNESDAY_ID].status == Status.QUEUED  # recorded, not failed
    monkeypatch.undo()  # the broker is back; any worker's sweeper publishes it again
    alias = app.conf.deadlines_database
    Run.objects.using(alias).filter(task_id=WEDNESDAY_ID).update(
        published_at=Store(alias).database_now() - timedelta(minutes=2),
        deadline=Store(alias).database_now() + timedelta(minutes=10),  # (a fake-clock date)
    )
    assert reconcile_once(app, Store(alias)).republished == [WEDNESDAY_ID]
    assert published(app) == [WEDNESDAY_ID]


def test_with_a_skew_budget_beat_publishes_nothing_while_its_clock_disagrees_with_the_ledger(
    app: Celery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app.conf.deadlines_clock_skew_budget = 0.5
    try:
        # beat's clock says Wednesday 09:00 in August; the ledger's says otherwise
        with use_clock(FakeClock(WEDNESDAY_0900 + timedelta(seconds=1))) as clock:
            run_beat(beat(app, tmp_path / "beat", ("digest", DIGEST)), clock, 3)
    finally:
        app.conf.deadlines_clock_skew_budget = None
    assert (published(app), runs(app)) == ([], {})
    assert "clock uncertain (offset" in caplog.text


# -- django-celery-beat: DatabaseDeadlineScheduler ------------------------------------------
