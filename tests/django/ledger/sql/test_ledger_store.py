"""The run ledger's statements, on SQLite (the embedded default) and PostgreSQL.

Time is the database's clock here, which no test can stop; instead of waiting, a test
*ages* a run: it moves the run's stored instants into the past, which is what the
database clock moving forward looks like to every comparison (the ``age`` write shows
in the run's history, so nothing is hidden).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.ledger.sql.rows import ClaimRefused, Lease, NewRun
from celery_deadlines.models import Run, RunEvent, Status
from tests.conftest import service_unavailable
from tests.django.conftest import DATABASES
from tests.support.processes import reachable

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgres"])

TTL = timedelta(seconds=30)
NO_RESERVE = timedelta(0)


@pytest.fixture(params=DATABASES)
def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "postgres" and not reachable("127.0.0.1", 5432):
        service_unavailable("PostgreSQL 127.0.0.1:5432")
    return Store(request.param)


def new_run(task_id: str = "run-1", deadline: datetime | None = None, retries: int = 0) -> NewRun:
    return NewRun(
        task_id=task_id,
        task_name="shop.charge",
        deadline=deadline,
        root_id=task_id,
        retries=retries,
        message_body=b'{"args": [], "kwargs": {}, "options": {}}',
    )


def in_(store: Store, seconds: float) -> datetime:
    return store.database_now() + timedelta(seconds=seconds)


def claim(store: Store, task_id: str = "run-1", owner: str = "w1:1", **kw: Any) -> Any:
    options: dict[str, Any] = {"retries": 0, "ttl": TTL, "reserve": NO_RESERVE, "max_lost": 3}
    options.update(kw)
    return store.runs.claim(
        task_id,
        options["retries"],
        task_name=options.get("task_name", "shop.charge"),
        owner=owner,
        ttl=options["ttl"],
        reserve=options["reserve"],
        max_lost_leases=options["max_lost"],
    )


def won(outcome: Lease | ClaimRefused) -> Lease:
    assert isinstance(outcome, Lease), outcome
    return outcome


def lost(outcome: Lease | ClaimRefused) -> ClaimRefused:
    assert isinstance(outcome, ClaimRefused), outcome
    return outcome


def age(store: Store, task_id: str, seconds: float) -> None:
    """Move every stored instant of a run ``seconds`` into the past."""
    run = Run.objects.using(store.using).get(task_id=task_id)
    shift = timedelta(seconds=seconds)
    for name in ("deadline", "lease_expires_at", "published_at", "available_at"):
        value = getattr(run, name)
        if value is not None:
            setattr(run, name, value - shift)
    run.op, run.op_detail = "age", f"test: {seconds} s later"
    run.save(using=store.using)


def row(store: Store, task_id: str = "run-1") -> Run:
    return Run.objects.using(store.using).get(task_id=task_id)


def events(store: Store, task_id: str = "run-1") -> list[tuple[str, str]]:
    return [
        (event.kind, event.outcome)
        for event in RunEvent.objects.using(store.using).filter(run__task_id=task_id)
    ]


def test_a_recorded_run_is_claimed_once_with_the_next_fencing_token(store: Store) -> None:
    assert store.outbox.enqueue(new_run())
    lease = won(claim(store))
    assert (lease.token, lease.version, lease.attempt) == (1, 1, 1)
    assert lost(claim(store, owner="w2:2")).why == ClaimRefused.HELD
    assert row(store).owner == "w1:1"


def test_recording_the_same_task_id_twice_keeps_the_first_run(store: Store) -> None:
    assert store.outbox.enqueue(new_run())
    assert not store.outbox.enqueue(new_run())
    assert Run.objects.using(store.using).count() == 1


def test_a_lapsed_lease_is_taken_over_with_a_newer_token_and_counted_as_lost(
    store: Store,
) -> None:
    store.outbox.enqueue(new_run())
    first = won(claim(store))
    age(store, "run-1", 31)
    second = won(claim(store, owner="w2:2"))
    assert second.token == first.token + 1
    assert row(store).lost_leases == 1


def test_a_stale_holder_cannot_write_and_its_attempt_is_recorded(store: Store) -> None:
    store.outbox.enqueue(new_run())
    stale = won(claim(store))
    age(store, "run-1", 31)
    won(claim(store, owner="w2:2"))
    assert not store.runs.checkpoint(stale, "w1:1", "charged", {"step": 2})
    assert not store.runs.finish(stale, "w1:1", Status.SUCCEEDED)
    rejected = RunEvent.objects.using(store.using).filter(outcome="rejected")
    assert [(e.kind, e.lease_token, e.owner) for e in rejected] == [
        ("checkpoint", 1, "w1:1"),
        ("succeeded", 1, "w1:1"),
    ]
    assert row(store).status == Status.RUNNING
    assert row(store).checkpoint_name == ""


def test_a_claim_a_database_crash_lost_issues_its_token_again_and_fences_its_first_holder(
    store: Store,
) -> None:
    # A won claim that did not wait for the disk (an exclusive owner's, on PostgreSQL)
    # is lost by a crash of the database as if it had never been: the row is put back
    # here as it was before the claim. The next claim issues the same token.
    store.outbox.enqueue(new_run())
    before = Run.objects.using(store.using).filter(task_id="run-1")
    kept = before.values("status", "owner", "lease_token", "version", "attempt").get()
    first = won(claim(store, owner="w1:1"))
    before.update(**kept, lease_expires_at=None)
    second = won(claim(store, owner="w2:1"))
    assert second.token == first.token
    effects = store.effects
    effects.record_intent(first, "order-1:pay", "pay", "execution", "f")
    assert effects.dispatch(first, "order-1:pay") is None
    assert effects.why_refused(first, "order-1:pay", "w1:1") == "stale_lease"
    assert store.runs.renew(first, "w1:1", TTL) is None
    assert not store.runs.checkpoint(first, "w1:1", "charged", {"step": 2})
    assert not store.plans.save(first, "w1:1", "plan-1", {"steps": []})
    assert not store.runs.finish(first, "w1:1", Status.SUCCEEDED)
    assert store.runs.last_write(first) == ("RUNNING", first.token, "w2:1", "claim")
    assert effects.dispatch(second, "order-1:pay") == 1
    assert effects.succeed(second, "order-1:pay", {"charged": 1})
    assert store.runs.finish(second, "w2:1", Status.SUCCEEDED)
    assert row(store).status == Status.SUCCEEDED


def test_a_paused_holder_whose_lease_lapsed_cannot_write_even_if_nobody_took_over(
    store: Store,
) -> None:
    store.outbox.enqueue(new_run())
    lease = won(claim(store))
    age(store, "run-1", 31)
    assert not store.runs.finish(lease, "w1:1", Status.SUCCEEDED)
    assert row(store).status == Status.RUNNING


def test_the_lease_never_outlives_the_deadline(store: Store) -> None:
    deadline = in_(store, 5)
    store.outbox.enqueue(new_run(deadline=deadline))
    lease = won(claim(store))
    assert lease.expires_at == deadline
    assert lease.deadline == deadline


def test_a_claim_is_refused_when_the_database_clock_leaves_less_than_the_reserve(
    store: Store,
) -> None:
    store.outbox.enqueue(new_run(deadline=in_(store, 5)))
    refused = lost(claim(store, reserve=timedelta(seconds=10)))
    assert refused.why == ClaimRefused.DEADLINE
    assert row(store).status == Status.QUEUED
    assert row(store).lease_token == 0


def test_a_claim_after_the_deadline_is_refused_as_passed_by_the_database_clock(
    store: Store,
) -> None:
    store.outbox.enqueue(new_run(deadline=in_(store, -1)))
    refused = lost(claim(store, reserve=timedelta(seconds=10)))
    assert refused.why == ClaimRefused.DEADLINE_PASSED
    assert refused.database_now is not None


def test_a_message_older_than_the_run_is_refused_as_stale(store: Store) -> None:
    store.outbox.enqueue(new_run(retries=2))
    assert lost(claim(store, retries=1)).why == ClaimRefused.STALE_MESSAGE
    won(claim(store, retries=2))


def test_a_finished_run_is_never_claimed_again(store: Store) -> None:
    store.outbox.enqueue(new_run())
    lease = won(claim(store))
    assert store.runs.finish(lease, "w1:1", Status.SUCCEEDED)
    assert lost(claim(store)).why == ClaimRefused.TERMINAL


def as_it_is(store: Store, task_id: str = "run-1") -> tuple[Any, ...]:
    """Everything of the run a claim or a refusal may change."""
    run = row(store, task_id)
    return (
        run.status,
        run.reason,
        run.owner,
        run.lease_token,
        run.lease_expires_at,
        run.version,
        run.attempt,
        run.lost_leases,
        run.op,
        run.updated_at,
    )


def refusals(store: Store, task_id: str = "run-1") -> list[tuple[str, str, str, int]]:
    return [
        (event.kind, event.owner, event.detail, event.version)
        for event in RunEvent.objects.using(store.using)
        .filter(run__task_id=task_id, outcome="rejected")
        .order_by("id")
    ]


def test_a_message_naming_another_task_claims_nothing_and_the_runs_own_message_claims_it(
    store: Store,
) -> None:
    store.outbox.enqueue(new_run())
    before = as_it_is(store)
    forged = lost(claim(store, owner="w2:2", task_name="shop.refund"))
    assert (forged.why, forged.status, forged.token, forged.owner) == (
        ClaimRefused.TASK_MISMATCH,
        Status.QUEUED,
        0,
        "",
    )
    assert as_it_is(store) == before
    assert refusals(store) == [("claim", "w2:2", "task_mismatch:shop.refund", 0)]
    lease = won(claim(store))  # the run's own task's message
    assert (lease.token, lease.attempt) == (1, 1)


def test_a_message_naming_another_task_is_refused_so_whatever_the_runs_state(
    store: Store,
) -> None:
    store.outbox.enqueue(new_run())
    lease = won(claim(store))
    held = as_it_is(store)
    assert lost(claim(store, owner="w2:2", task_name="shop.refund")).why == "task_mismatch"
    assert as_it_is(store) == held  # not "held": the run is not the message's at all
    assert store.runs.finish(lease, "w1:1", Status.SUCCEEDED)
    ended = as_it_is(store)
    assert lost(claim(store, owner="w2:2", task_name="shop.refund")).why == "task_mismatch"
    assert as_it_is(store) == ended
    assert [detail for _, _, detail, _ in refusals(store)] == ["task_mismatch:shop.refund"] * 2


def test_a_gate_refusal_of_a_message_naming_another_task_leaves_the_run_as_it_was(
    store: Store,
) -> None:
    store.outbox.enqueue(new_run())
    before = as_it_is(store)
    assert not store.runs.refuse(
        "run-1",
        "shop.refund",
        0,
        status=Status.EXPIRED,
        reason="invalid_deadline",
        detail="unreadable deadline header 'garbage'",
        deadline=None,
    )
    assert as_it_is(store) == before
    assert refusals(store) == [("refuse", "", "task_mismatch:shop.refund", 0)]
    won(claim(store))


def test_a_claim_of_an_unrecorded_run_says_it_is_missing(store: Store) -> None:
    assert lost(claim(store, "never-recorded")).why == ClaimRefused.MISSING


def test_every_write_appends_its_event_with_the_database_clock(store: Store) -> None:
    store.outbox.enqueue(new_run())
    lease = won(claim(store))
    assert store.runs.checkpoint(lease, "w1:1", "reserved", {"sku": "A1"})
    assert store.runs.finish(lease, "w1:1", Status.SUCCEEDED)
    assert events(store) == [
        ("enqueue", "applied"),
        ("claim", "applied"),
        ("checkpoint", "applied"),
        ("succeeded", "applied"),
    ]
    history = list(RunEvent.objects.using(store.using).filter(run__task_id="run-1"))
    assert [e.version for e in history] == [0, 1, 2, 3]
    assert [e.lease_token for e in history] == [0, 1, 1, 1]
    assert all(a.at <= b.at for a, b in itertools.pairwise(history))


def test_the_next_claim_resumes_from_the_last_durable_checkpoint(store: Store) -> None:
    store.outbox.enqueue(new_run())
    first = won(claim(store))
    assert store.runs.checkpoint(first, "w1:1", "reserved", {"sku": "A1", "qty": 2})
    age(store, "run-1", 31)
    second = won(claim(store, owner="w2:2"))
    assert (second.checkpoint_name, second.checkpoint_data) == ("reserved", {"sku": "A1", "qty": 2})
    assert row(store).checkpoint_token == first.token


def test_renewal_extends_from_the_database_clock_and_stops_at_the_deadline(
    store: Store,
) -> None:
    deadline = in_(store, 60)
    store.outbox.enqueue(new_run(deadline=deadline))
    lease = won(claim(store))
    renewed = store.runs.renew(lease, "w1:1", TTL)
    assert renewed is not None
    assert renewed <= store.database_now() + TTL
    assert store.runs.renew(lease, "w1:1", timedelta(seconds=600)) == deadline
    age(store, "run-1", 61)
    assert store.runs.renew(lease, "w1:1", TTL) is None
    assert events(store)[-1] == ("renew", "rejected")


def test_a_retry_releases_the_lease_and_only_the_next_retry_number_can_claim(
    store: Store,
) -> None:
    store.outbox.enqueue(new_run())
    lease = won(claim(store))
    assert store.runs.retry(
        lease, "w1:1", retries=1, available_at=None, message_body=b"{}", detail="retries=1"
    )
    assert row(store).status == Status.RETRYING
    assert lost(claim(store, retries=0)).why == ClaimRefused.STALE_MESSAGE
    assert won(claim(store, retries=1)).token == lease.token + 1


def test_a_gate_refusal_ends_a_waiting_run_but_not_one_another_worker_owns(
    store: Store,
) -> None:
    store.outbox.enqueue(new_run("waiting"))
    assert store.runs.refuse(
        "waiting",
        "shop.charge",
        0,
        status=Status.EXPIRED,
        reason="deadline_passed",
        detail="late",
        deadline=None,
    )
    assert row(store, "waiting").status == Status.EXPIRED
    store.outbox.enqueue(new_run("owned"))
    won(claim(store, "owned"))
    assert not store.runs.refuse(
        "owned",
        "shop.charge",
        0,
        status=Status.EXPIRED,
        reason="deadline_passed",
        detail="late",
        deadline=None,
    )
    assert row(store, "owned").status == Status.RUNNING


def test_a_refused_message_without_a_run_gets_an_ended_run(store: Store) -> None:
    assert store.runs.refuse(
        "by-name",
        "t",
        0,
        status=Status.EXPIRED,
        reason="invalid_deadline",
        detail="bad",
        deadline=None,
    )
    assert (row(store, "by-name").status, row(store, "by-name").reason) == (
        Status.EXPIRED,
        "invalid_deadline",
    )


def test_unclaimed_runs_past_their_deadline_expire_with_the_claim_gates_reason(
    store: Store,
) -> None:
    store.outbox.enqueue(new_run("late", deadline=in_(store, 1)))
    store.outbox.enqueue(replace(new_run("notice", deadline=in_(store, 1)), delivery_task=True))
    store.outbox.enqueue(new_run("in-time", deadline=in_(store, 600)))
    age(store, "late", 2)
    age(store, "notice", 2)
    expired = store.sweeps.expire_unclaimed()
    assert sorted(e.task_id for e in expired) == ["late", "notice"]
    # the words a worker's claim gate uses for the same deadline (gates.expiry_reason)
    assert (row(store, "late").status, row(store, "late").reason) == (
        Status.EXPIRED,
        "deadline_passed",
    )
    assert (row(store, "notice").status, row(store, "notice").reason) == (
        Status.EXPIRED,
        "delivery_expired",
    )
    assert {e.task_id: e.reason for e in expired} == {
        "late": "deadline_passed",
        "notice": "delivery_expired",
    }
    assert row(store, "in-time").status == Status.QUEUED


def test_a_lapsed_lease_is_requeued_once_with_a_fresh_token(store: Store) -> None:
    store.outbox.enqueue(new_run(deadline=in_(store, 600)))
    lease = won(claim(store))
    age(store, "run-1", 31)
    [lapsed] = store.sweeps.lapsed_leases()
    assert store.sweeps.requeue_lapsed(lapsed)
    assert not store.sweeps.requeue_lapsed(lapsed)  # a second reconciler changes nothing
    after = row(store)
    assert (after.status, after.lease_token, after.lost_leases) == (Status.QUEUED, 2, 1)
    assert not store.runs.finish(lease, "w1:1", Status.SUCCEEDED)


def test_runs_unclaimed_for_too_long_are_offered_for_republishing_once(store: Store) -> None:
    store.outbox.enqueue(new_run())
    assert store.sweeps.unclaimed(timedelta(seconds=60)) == []
    age(store, "run-1", 61)
    [unclaimed] = store.sweeps.unclaimed(timedelta(seconds=60))
    assert unclaimed.message_body == b'{"args": [], "kwargs": {}, "options": {}}'
    assert store.sweeps.mark_republished(unclaimed.run_id, unclaimed.version)
    assert not store.sweeps.mark_republished(unclaimed.run_id, unclaimed.version)
    assert store.sweeps.unclaimed(timedelta(seconds=60)) == []


def test_claim_and_completion_are_one_statement_each_on_postgresql(store: Store) -> None:
    if store.dialect.vendor != "postgresql":
        pytest.skip("the one-round-trip promise is PostgreSQL's (SQLite is in-process)")
    connection = connections[store.using]
    with CaptureQueriesContext(connection) as enqueue:
        store.outbox.enqueue(new_run(deadline=datetime.now(UTC) + TTL))
    with CaptureQueriesContext(connection) as claimed:
        lease = won(claim(store))
    with CaptureQueriesContext(connection) as completed:
        assert store.runs.finish(lease, "w1:1", Status.SUCCEEDED)
    assert (len(enqueue), len(claimed), len(completed)) == (1, 1, 1)
    assert events(store) == [("enqueue", "applied"), ("claim", "applied"), ("succeeded", "applied")]


def test_a_lost_claim_is_one_statement_with_its_event_on_postgresql(store: Store) -> None:
    if store.dialect.vendor != "postgresql":
        pytest.skip("the one-round-trip promise is PostgreSQL's (SQLite is in-process)")
    store.outbox.enqueue(new_run())
    won(claim(store))
    with CaptureQueriesContext(connections[store.using]) as refused:
        loss = lost(claim(store, owner="w2:1"))
    assert len(refused) == 1
    assert (loss.why, loss.status, loss.token, loss.owner) == ("held", "RUNNING", 1, "w1:1")
    assert events(store)[-1] == ("claim", "rejected")


def test_the_producers_row_and_a_won_claim_leave_no_lock_in_the_runs_row(store: Store) -> None:
    # PostgreSQL marks a locked row in the row itself (its xmax): a checked reference
    # from the event to its run locked the row the same statement had just written, a
    # WAL record for every transition (migration 0012 dropped the check)
    if store.dialect.vendor != "postgresql":
        pytest.skip("a row lock is written in the row on PostgreSQL only")

    def locker() -> str:
        with connections[store.using].cursor() as cursor:
            cursor.execute("SELECT xmax::text FROM celery_deadlines_run WHERE task_id = 'run-1'")
            return str(cursor.fetchone()[0])

    store.outbox.enqueue(new_run())
    assert locker() == "0"
    won(claim(store))
    assert locker() == "0"
    assert events(store) == [("enqueue", "applied"), ("claim", "applied")]


def racing_the_purge(store: Store, write: Callable[[Store], Any]) -> Any:
    """``write(store)``'s result, run in a thread of its own while a purge's transaction
    has deleted run-1 and its events and not committed yet, committed once ``write``
    waits for it (a backend of the test database waits on a lock) or has ended."""
    run_id = row(store).id
    purge = connections.create_connection(store.using)
    purge.set_autocommit(False)
    with purge.cursor() as cursor:
        cursor.execute("DELETE FROM celery_deadlines_runevent WHERE run_id = %s", [run_id])
        cursor.execute("DELETE FROM celery_deadlines_run WHERE id = %s", [run_id])
    outcome: dict[str, Any] = {}

    def racer() -> None:
        try:
            outcome["result"] = write(Store(store.using))
        finally:
            connections[store.using].close()

    thread = threading.Thread(target=racer)
    thread.start()
    try:
        polls = 0
        while thread.is_alive() and polls < 1200:  # a minute at most: a poll, not a timing
            with connections[store.using].cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
                if cursor.fetchone()[0]:
                    break
            thread.join(0.05)
            polls += 1
    finally:
        purge.commit()
        purge.close()
        thread.join(30)
    return outcome["result"]


def orphans(store: Store) -> int:
    """Events whose run does not exist."""
    with connections[store.using].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM celery_deadlines_runevent e WHERE NOT EXISTS "
            "(SELECT 1 FROM celery_deadlines_run r WHERE r.id = e.run_id)"
        )
        return int(cursor.fetchone()[0])


def test_a_claim_lost_while_its_run_is_purged_leaves_no_event_behind(store: Store) -> None:
    # PostgreSQL does not check an event's run (migration 0012): the refusal keeps the
    # row it explains, so the purge's delete and the refusal's event cannot both land
    if store.dialect.vendor != "postgresql":
        pytest.skip("SQLite checks an event's run, and serialises writers")
    store.outbox.enqueue(new_run())
    assert store.runs.finish(won(claim(store)), "w1:1", Status.SUCCEEDED)
    refused = lost(racing_the_purge(store, lambda other: claim(other, owner="w2:1")))
    assert refused.why == ClaimRefused.MISSING  # the run is gone: as if it never was
    assert orphans(store) == 0


def test_a_stale_write_while_its_run_is_purged_leaves_no_event_behind(store: Store) -> None:
    if store.dialect.vendor != "postgresql":
        pytest.skip("SQLite checks an event's run, and serialises writers")
    store.outbox.enqueue(new_run())
    lease = won(claim(store))
    assert store.runs.finish(lease, "w1:1", Status.SUCCEEDED)
    assert not racing_the_purge(
        store, lambda other: other.runs.checkpoint(lease, "w1:1", "late", {"step": 2})
    )
    assert orphans(store) == 0


def test_deleting_a_run_deletes_its_history(store: Store) -> None:
    store.outbox.enqueue(new_run())
    store.runs.finish(won(claim(store)), "w1:1", Status.SUCCEEDED)
    lost(claim(store, owner="w2:1"))
    run = Run.objects.using(store.using).get(task_id="run-1")
    assert RunEvent.objects.using(store.using).filter(run=run).count() == 4
    run.delete()
    assert not RunEvent.objects.using(store.using).filter(run_id=run.pk).exists()


def test_an_ended_run_is_read_back_with_its_outcome_and_when_it_ended_by_the_database_clock(
    store: Store,
) -> None:
    store.outbox.enqueue(new_run())
    lease = won(claim(store))
    assert store.runs.ended("run-1") is None  # running: not ended
    assert store.runs.finish(lease, "w1:1", Status.FAILED, "error", "ValueError('boom')")
    ended = store.runs.ended("run-1")
    assert ended is not None
    assert (ended.status, ended.reason, ended.detail) == ("FAILED", "error", "ValueError('boom')")
    assert ended.ended_at is not None
    assert ended.ended_at.tzinfo is UTC
    assert lease.database_now <= ended.ended_at <= store.database_now()
