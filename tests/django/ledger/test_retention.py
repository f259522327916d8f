"""Retention on SQLite and PostgreSQL: what the purge deletes, what it never touches,
batches, the dry run, the command, and the reconciler's hourly share."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from io import StringIO

import pytest
from celery import Celery
from django.core.management import CommandError, call_command
from django.test import override_settings

from celery_deadlines.checks import check_retention, check_settings
from celery_deadlines.ledger.reconcile import Reconciler
from celery_deadlines.ledger.retention import PeriodicPurge, preview, purge
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.ledger.sql.rows import Lease
from celery_deadlines.models import Effect, Run, RunEvent, RunPlan, Status
from celery_deadlines.rules.retention import cutoff
from celery_deadlines.testing import FakeClock
from tests.django.conftest import one_database

DAY = timedelta(days=1)
WEEK = timedelta(days=7)
NOT_ENDED = [
    Status.QUEUED,
    Status.CLOCK_UNCERTAIN,
    Status.RUNNING,
    Status.RETRYING,
    Status.UNKNOWN,
    Status.PAUSED,
]
TERMINAL_VALUES = {"SUCCEEDED", "FAILED", "EXPIRED"}


def run(store: Store, task_id: str, status: Status, age: timedelta) -> Run:
    """A run whose last write was ``age`` ago (one audit event: its insert)."""
    at = store.database_now() - age
    return Run.objects.using(store.using).create(
        task_id=task_id, task_name="shop.ship", status=status, created_at=at, updated_at=at
    )


def effect(
    store: Store,
    owner: Run,
    key: str,
    state: str = "SUCCEEDED",
    *,
    age: timedelta | None = None,
    asked: timedelta | None = None,
) -> Effect:
    """An effect of ``owner`` last changed ``age`` ago (default: when its run ended) and
    last asked for ``asked`` ago (default: never). Its insert is one audit event."""
    now = store.database_now()
    at = owner.updated_at if age is None else now - age
    return Effect.objects.using(store.using).create(
        key=key,
        run=owner,
        name="charge",
        state=state,
        lease_token=1,
        fingerprint="f",
        created_at=at,
        updated_at=at,
        asked_at=None if asked is None else now - asked,
    )


def plan(store: Store, owner: Run) -> RunPlan:
    return RunPlan.objects.using(store.using).create(
        run=owner, document={}, lease_token=1, created_at=owner.updated_at
    )


def left(store: Store) -> set[str]:
    return set(Run.objects.using(store.using).values_list("task_id", flat=True))


def children_of(store: Store, task_id: str) -> tuple[int, int, int]:
    """(events, effects, plans) of the run ``task_id`` (gone or not)."""
    using = store.using
    return (
        RunEvent.objects.using(using).filter(run__task_id=task_id).count(),
        Effect.objects.using(using).filter(run__task_id=task_id).count(),
        RunPlan.objects.using(using).filter(run__task_id=task_id).count(),
    )


def test_purge_deletes_ended_runs_older_than_the_cutoff_with_their_events_effects_and_plans(
    alias: str,
) -> None:
    store = Store(alias)
    old = [run(store, f"old-{s}", s, 20 * DAY) for s in Status if s.value in TERMINAL_VALUES]
    effect(store, old[0], "order-1:charge", "SUCCEEDED")
    effect(store, old[1], "order-2:charge", "FAILED")
    effect(store, old[2], "order-3:charge", "NOT_DISPATCHED")
    plan(store, old[0])
    young = run(store, "young", Status.SUCCEEDED, 13 * DAY)
    effect(store, young, "order-4:charge")

    before, counts = purge(store, 14 * DAY)

    assert left(store) == {"young"}
    assert (counts.runs, counts.effects, counts.plans, counts.batches) == (3, 3, 1, 1)
    assert counts.events == 6  # each run's insert, and each effect's
    assert all(children_of(store, r.task_id) == (0, 0, 0) for r in old)
    assert children_of(store, "young") == (2, 1, 0)
    assert Effect.objects.using(alias).get().key == "order-4:charge"
    assert before < store.database_now() - 14 * DAY + timedelta(minutes=1)
    assert not counts.more


def test_purge_never_deletes_a_run_that_has_not_ended_however_old(alias: str) -> None:
    store = Store(alias)
    for status in NOT_ENDED:
        effect(store, run(store, status.value, status, 400 * DAY), f"{status.value}:k")

    _, counts = purge(store, timedelta(seconds=1))

    assert counts.runs == 0
    assert left(store) == {status.value for status in NOT_ENDED}
    assert Effect.objects.using(alias).count() == len(NOT_ENDED)


@pytest.mark.parametrize("state", ["DISPATCHED", "UNKNOWN"])
def test_an_ended_run_with_an_unresolved_effect_is_kept_whole(alias: str, state: str) -> None:
    # an operator may expire a run whose effect has no outcome yet: it waits for one
    store = Store(alias)
    expired = run(store, "expired", Status.EXPIRED, 90 * DAY)
    effect(store, expired, "order-9:charge", state)
    effect(store, expired, "order-9:mail", "SUCCEEDED")

    _, counts = purge(store, 14 * DAY)

    assert counts.runs == 0
    assert children_of(store, "expired") == (3, 2, 0)


def test_an_ended_run_whose_effect_changed_since_the_cutoff_is_kept_whole(alias: str) -> None:
    store = Store(alias)
    settled = run(store, "settled", Status.EXPIRED, 30 * DAY)
    effect(store, settled, "order-5:charge", "SUCCEEDED", age=DAY)  # resolved by hand

    _, counts = purge(store, 14 * DAY)

    assert (counts.runs, left(store)) == (0, {"settled"})


def claimed(store: Store, task_id: str) -> Lease:
    from celery_deadlines.ledger.sql.rows import NewRun

    store.outbox.enqueue(
        NewRun(
            task_id=task_id,
            task_name="shop.ship",
            root_id=task_id,
            message_body=b"{}",
        )
    )
    lease = store.runs.claim(
        task_id,
        0,
        task_name="shop.ship",
        owner="w:1",
        ttl=timedelta(seconds=30),
        reserve=timedelta(0),
        max_lost_leases=3,
    )
    assert isinstance(lease, Lease)
    return lease


def test_an_effect_replayed_to_a_live_run_keeps_its_ended_run_for_the_retention(
    alias: str,
) -> None:
    store = Store(alias)
    first = run(store, "first", Status.SUCCEEDED, 30 * DAY)
    effect(store, first, "order-6:charge", "SUCCEEDED")
    duplicate = claimed(store, "duplicate")  # the same order, submitted again
    recorded = store.effects.record_intent(duplicate, "order-6:charge", "charge", "execution", "f")
    assert recorded.state == "SUCCEEDED"  # replayed: it may be asked for again

    _, counts = purge(store, 14 * DAY)
    assert (counts.runs, left(store)) == (0, {"first", "duplicate"})

    # no attempt asked for it during a whole retention: its record may go
    Effect.objects.using(alias).update(asked_at=store.database_now() - 15 * DAY)
    _, counts = purge(store, 14 * DAY)
    assert (counts.runs, counts.effects, left(store)) == (1, 1, {"duplicate"})


def test_purge_goes_in_batches_and_stops_at_its_bound_saying_more_is_left(alias: str) -> None:
    store = Store(alias)
    for number in range(7):
        run(store, f"r{number}", Status.SUCCEEDED, (20 + number) * DAY)

    _, bounded = purge(store, 14 * DAY, batch_size=3, max_batches=1)
    assert (bounded.runs, bounded.batches, bounded.more) == (3, 1, True)
    assert left(store) == {"r0", "r1", "r2", "r3"}  # the oldest went first

    _, rest = purge(store, 14 * DAY, batch_size=3)
    assert (rest.runs, rest.batches, rest.more) == (4, 2, False)
    assert left(store) == set()


def test_runs_that_ended_in_one_instant_go_in_one_purge_whatever_the_batch_size(
    alias: str,
) -> None:
    # the sweeper ends up to 500 runs in one statement: on SQLite they share one
    # updated_at, written by the database in its own spelling
    store = Store(alias)
    for number in range(5):
        run(store, f"swept-{number}", Status.EXPIRED, DAY)
    d = store.dialect
    instant = d.now_plus if d.vendor == "sqlite" else "(now() + make_interval(secs => %s))"
    store.execute(f"UPDATE celery_deadlines_run SET updated_at = {instant}", [d.seconds(-20 * DAY)])
    assert len(set(Run.objects.using(alias).values_list("updated_at", flat=True))) == 1

    _, counts = purge(store, 14 * DAY, batch_size=2)

    assert (counts.runs, counts.batches, left(store)) == (5, 3, set())


def test_a_dry_run_counts_what_would_go_and_what_is_kept_and_deletes_nothing(
    alias: str,
) -> None:
    store = Store(alias)
    gone = run(store, "gone", Status.FAILED, 20 * DAY)
    effect(store, gone, "order-7:charge", "FAILED")
    plan(store, gone)
    kept = run(store, "kept", Status.EXPIRED, 20 * DAY)
    effect(store, kept, "order-8:charge", "UNKNOWN")
    run(store, "live", Status.RUNNING, 20 * DAY)
    events = RunEvent.objects.using(alias).count()

    _, counts = preview(store, 14 * DAY)

    assert (counts.runs, counts.events, counts.effects, counts.plans) == (1, 2, 1, 1)
    assert (counts.kept, counts.batches) == (1, 0)
    assert left(store) == {"gone", "kept", "live"}
    assert RunEvent.objects.using(alias).count() == events


def test_the_batch_statement_reads_the_ended_runs_index(alias: str) -> None:
    store = Store(alias)
    run(store, "old", Status.SUCCEEDED, 20 * DAY)
    before = cutoff(store.database_now(), 14 * DAY)
    if alias == "postgres":  # a table this small is read whole unless told otherwise
        store.execute("SET enable_seqscan = off", [])
    try:
        plans = store.retention.plans(before, 500, [1, 2])
    finally:
        if alias == "postgres":
            store.execute("RESET enable_seqscan", [])
    selection = "\n".join(plans["select"])
    assert "cdl_run_ended_idx" in selection, selection
    assert "Seq Scan on celery_deadlines_run" not in selection
    for what in ("events", "effects", "plans"):
        assert "_idx" in "\n".join(plans[what]), plans[what]  # by run id, never a scan


def command(alias: str, *args: str) -> str:
    out = StringIO()
    call_command("deadlines", "--database", alias, "purge", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_the_purge_command_deletes_what_the_setting_says_and_prints_the_counts(
    alias: str,
) -> None:
    store = Store(alias)
    run(store, "month-old", Status.SUCCEEDED, 30 * DAY)
    run(store, "three-weeks-old", Status.SUCCEEDED, 21 * DAY)

    with override_settings(CELERY_DEADLINES_RETENTION=25 * 86_400):
        assert "would purge 1 ended runs" in command(alias, "--dry-run")
        text = command(alias)

    assert text.startswith("purged 1 ended runs (1 events, 0 effects, 0 plans) that ended")
    assert "(older than 25 days) in 1 batch" in text
    assert left(store) == {"three-weeks-old"}


def test_the_purge_command_takes_an_age_and_answers_in_json(alias: str) -> None:
    store = Store(alias)
    run(store, "old", Status.EXPIRED, 3 * DAY)

    facts = json.loads(command(alias, "--older-than", "P2D", "--batch-size", "10", "--json"))

    assert facts["dry_run"] is False
    assert (facts["runs"], facts["events"], facts["batches"]) == (1, 1, 1)
    assert facts["older_than_seconds"] == 2 * 86_400
    assert datetime.fromisoformat(facts["cutoff"]) < store.database_now() - 2 * DAY + DAY
    assert left(store) == set()


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--older-than", "soon"], "--older-than must be a number of seconds"),
        (["--older-than", "0d"], "more than zero"),
        (["--older-than", "P1M"], "years and months have no fixed length"),
        (["--batch-size", "0"], "--batch-size must be a whole number from 1 to 10000"),
    ],
)
def test_the_purge_command_refuses_bad_input_saying_what_is_wrong(
    alias: str, args: list[str], complaint: str
) -> None:
    with pytest.raises(CommandError, match=complaint):
        command(alias, *args)


def test_the_purge_command_asks_for_an_age_when_the_retention_is_off(alias: str) -> None:
    with (
        override_settings(CELERY_DEADLINES_RETENTION=None),
        pytest.raises(CommandError, match="name --older-than"),
    ):
        command(alias)


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("retention-test", broker="memory://", backend="cache+memory://")
    app.conf.update(deadlines_retention=14 * DAY, task_default_queue="retention")
    yield app
    app.close()


def test_the_reconciler_purges_on_its_first_pass_then_once_an_hour(
    alias: str, app: Celery, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(alias)
    reconciler = Reconciler(app, store, timedelta(seconds=10))
    run(store, "first", Status.SUCCEEDED, 20 * DAY)

    with caplog.at_level(logging.INFO, logger="celery_deadlines"):
        reconciler.run_pass()
    assert left(store) == set()
    assert "purged the run ledger: 1 runs (1 events, 0 effects, 0 plans) in 1 batch" in (
        caplog.text
    )
    assert "(deadlines_retention 14 days)" in caplog.text

    run(store, "second", Status.SUCCEEDED, 20 * DAY)
    reconciler.run_pass()
    clock.advance(minutes=59)
    reconciler.run_pass()
    assert left(store) == {"second"}  # within the hour: not again

    clock.advance(minutes=1)
    reconciler.run_pass()
    assert left(store) == set()


def test_a_pass_stopped_at_its_batch_bound_goes_on_at_the_next_pass(
    alias: str, app: Celery, clock: FakeClock
) -> None:
    store = Store(alias)
    periodic = PeriodicPurge(batch_size=2, max_batches=1)
    for number in range(3):
        run(store, f"r{number}", Status.FAILED, 20 * DAY)

    first = periodic.run_if_due(app, store)
    assert first is not None
    assert (first.runs, first.more) == (2, True)
    second = periodic.run_if_due(app, store)  # same instant: it is behind
    assert second is not None
    assert (second.runs, second.more) == (1, False)
    assert periodic.run_if_due(app, store) is None  # caught up: the interval again


def test_no_periodic_purge_when_the_retention_is_off(
    alias: str, app: Celery, clock: FakeClock
) -> None:
    store = Store(alias)
    app.conf.deadlines_retention = None
    run(store, "ancient", Status.SUCCEEDED, 1000 * DAY)

    assert PeriodicPurge().run_if_due(app, store) is None
    assert left(store) == {"ancient"}


def test_a_dedicated_connection_purges_in_a_transaction_of_its_own(alias: str) -> None:
    # the workers' reconciler runs on a dedicated connection, in autocommit
    shared = Store(alias)
    run(shared, "old", Status.SUCCEEDED, 20 * DAY)
    dedicated = Store(alias, dedicated=True)
    try:
        _, counts = purge(dedicated, 14 * DAY)
        assert counts.runs == 1
        assert dedicated.database_now()  # back in autocommit, still usable
    finally:
        dedicated.close()
    assert left(shared) == set()


@pytest.mark.parametrize("alias", [one_database("postgres", "postgresql")], indirect=True)
def test_a_run_another_purge_holds_is_skipped_not_waited_for(alias: str) -> None:
    # PostgreSQL locks rows (SQLite serialises writers: one purge at a time)
    store = Store(alias)
    run(store, "held", Status.SUCCEEDED, 21 * DAY)
    run(store, "free", Status.SUCCEEDED, 20 * DAY)
    other = Store(alias, dedicated=True)
    try:
        with other.transaction():
            other.execute(
                "SELECT id FROM celery_deadlines_run WHERE task_id = 'held' FOR UPDATE", []
            )
            _, counts = purge(store, 14 * DAY)
        assert (counts.runs, left(store)) == (1, {"held"})
    finally:
        other.close()


def test_a_retention_shorter_than_the_longest_budget_is_a_warning_naming_both() -> None:
    with override_settings(CELERY_DEADLINES_RETENTION=3 * 86_400):
        [warning] = check_retention(None)
    assert warning.id == "celery_deadlines.W003"
    assert "CELERY_DEADLINES_RETENTION (3 days)" in warning.msg
    assert "CELERY_DEADLINES_MAX_BUDGET (7 days)" in warning.msg
    with override_settings(CELERY_DEADLINES_RETENTION=None):
        assert check_retention(None) == []
    assert check_retention(None) == []  # the defaults: two weeks, one week


@pytest.mark.parametrize("value", [-1, "14d", float("inf")])
def test_a_bad_retention_is_a_check_error_naming_the_setting(value: object) -> None:
    with override_settings(CELERY_DEADLINES_RETENTION=value):
        found = check_settings(None)
        assert check_retention(None) == []  # said once, by E001
    assert [message.id for message in found] == ["celery_deadlines.E001"]
    assert "CELERY_DEADLINES_RETENTION" in found[0].msg


def test_a_bad_retention_fails_the_periodic_purge_once_an_interval_not_every_pass(
    app: Celery, clock: FakeClock
) -> None:
    from celery_deadlines import ConfigurationError

    store = Store("default")  # not reached: the setting is read first
    app.conf.deadlines_retention = "two weeks"
    periodic = PeriodicPurge()
    with pytest.raises(ConfigurationError, match="CELERY_DEADLINES_RETENTION"):
        periodic.run_if_due(app, store)
    assert periodic.run_if_due(app, store) is None  # not again before the interval
