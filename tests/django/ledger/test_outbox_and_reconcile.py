"""The outbox and one reconciliation pass, against the ledger on SQLite and PostgreSQL.

The Celery app here publishes to kombu's in-memory transport, so what the sweeper and
the reconciler publish can be read back; its result backend is in memory too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from django.db import transaction

from celery_deadlines import DeadlineRefused
from celery_deadlines.ledger import operations, outbox
from celery_deadlines.ledger.reconcile import Report, _settle, reconcile_once
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.ledger.sql.rows import Lease, NewRun
from celery_deadlines.models import Effect, Run, Status
from celery_deadlines.rules.records import Recorded
from tests.conftest import service_unavailable
from tests.django.conftest import DATABASES
from tests.support.memory_queue import drain
from tests.support.processes import reachable

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgres"])

#: What a worker of a json app decodes a recorded message with.
JSON = frozenset({"application/json"})


@pytest.fixture(params=DATABASES)
def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "postgres" and not reachable("127.0.0.1", 5432):
        service_unavailable("PostgreSQL 127.0.0.1:5432")
    return Store(request.param)


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("reconcile-test", broker="memory://", backend="cache+memory://")
    app.conf.update(
        deadlines_republish_after=60, deadlines_max_lost_leases=1, task_default_queue="q"
    )
    published(app)  # the in-memory transport is per process: start from an empty queue
    yield app
    app.close()


def published(app: Celery) -> list[dict[str, Any]]:
    """Every message waiting in the in-memory queue ``q`` (drained)."""
    return drain(app, "q")


def record(store: Store, task_id: str, deadline_in: float | None = 600) -> NewRun:
    body, content_type, encoding = outbox.encode_message(
        "json", [7], {"fast": True}, {"headers": {"x_deadline": 1.0}}
    )
    deadline = (
        None if deadline_in is None else store.database_now() + timedelta(seconds=deadline_in)
    )
    run = NewRun(
        task_id=task_id,
        task_name="shop.ship",
        deadline=deadline,
        root_id=task_id,
        message_body=body,
        content_type=content_type,
        content_encoding=encoding,
    )
    store.outbox.enqueue(run)
    return run


def lapse(store: Store, task_id: str) -> None:
    """Let the lease lapse past the reconciler's grace (store.SUPERVISOR_GRACE)."""
    Run.objects.using(store.using).filter(task_id=task_id).update(
        lease_expires_at=store.database_now() - timedelta(seconds=2), op="age"
    )


def claim(store: Store, task_id: str) -> Lease:
    lease = store.runs.claim(
        task_id,
        0,
        task_name="shop.ship",
        owner="w:1",
        ttl=timedelta(seconds=30),
        reserve=timedelta(0),
        max_lost_leases=5,
    )
    assert isinstance(lease, Lease)
    return lease


def undated_run(task_id: str) -> NewRun:
    """A run with no deadline and an empty JSON message (the outbox's publish tests)."""
    return NewRun(
        task_id=task_id,
        task_name="shop.ship",
        root_id=task_id,
        message_body=b"{}",
    )


def status(store: Store, task_id: str) -> tuple[str, str]:
    run = Run.objects.using(store.using).get(task_id=task_id)
    return run.status, run.reason


def test_the_recorded_message_decodes_to_what_was_published() -> None:
    body, content_type, encoding = outbox.encode_message(
        "json", (1, "a"), {"k": [2]}, {"queue": "shop", "producer": object(), "countdown": 5}
    )
    assert outbox.decode_message(body, content_type, encoding, accept={content_type}) == {
        "args": [1, "a"],
        "kwargs": {"k": [2]},
        "options": {"queue": "shop"},  # no producer object, no relative countdown
    }


def test_a_publish_that_fails_outside_a_transaction_ends_the_run(store: Store) -> None:
    run = undated_run("p-1")
    assert outbox.record(store, run, accept=JSON) is Recorded.NOW  # the caller sends now
    outbox.publish_failed(store, "p-1", ConnectionError("broker down"))  # and it raised
    assert status(store, "p-1") == (Status.FAILED, "publish_failed")


def test_a_caller_that_tries_again_after_a_failed_publish_publishes_the_run(
    store: Store,
) -> None:
    # Regression, nemesis soak (RabbitMQ seed 7): the second try returned as if sent,
    # and the run stayed FAILED publish_failed, never published.
    run = undated_run("p-3")
    assert outbox.record(store, run, accept=JSON) is Recorded.NOW
    outbox.publish_failed(store, "p-3", ConnectionError("broker down"))
    assert outbox.record(store, run, accept=JSON) is Recorded.NOW  # sent again
    assert status(store, "p-3") == (Status.QUEUED, "")
    # now the same run: not sent
    assert outbox.record(store, run, accept=JSON) is Recorded.ALREADY


def test_a_caller_that_tries_again_after_its_publish_was_refused_publishes_the_run(
    store: Store,
) -> None:
    """Refused at enqueue (recorded ended, never published): the caller was told, and a
    publish under the id again is recorded again and sent. A run whose message was
    sent, refused afterwards (at a claim), stands: its caller was told by its result."""
    refused = undated_run("p-4")
    assert store.outbox.record_ended(
        refused, Status.EXPIRED, "queue_backlog", "refused", "refuse_publish", published=False
    )
    assert outbox.record(store, refused, accept=JSON) is Recorded.NOW
    assert status(store, "p-4") == (Status.QUEUED, "")
    assert outbox.record(store, refused, accept=JSON) is Recorded.ALREADY

    claimed = undated_run("p-5")
    assert store.outbox.record_ended(
        claimed, Status.EXPIRED, "deadline_passed", "refused", "refuse", published=True
    )
    assert outbox.record(store, claimed, accept=JSON) is Recorded.ALREADY
    assert status(store, "p-5") == (Status.EXPIRED, "deadline_passed")


def test_a_run_recorded_in_a_transaction_is_sent_when_it_commits(store: Store) -> None:
    run = undated_run("p-2")
    calls: list[str] = []
    with transaction.atomic(using=store.using):
        assert outbox.record(store, run, accept=JSON) is Recorded.AT_COMMIT
        outbox.at_commit(store, lambda: calls.append("publish"))
        assert calls == []  # not before the commit
    assert calls == ["publish"]
    assert status(store, "p-2") == (Status.QUEUED, "")


def test_a_run_recorded_in_a_transaction_that_rolls_back_is_never_sent(store: Store) -> None:
    calls: list[str] = []
    recorded: list[Recorded] = []

    def request() -> None:  # the caller's request, which fails after the publish
        with transaction.atomic(using=store.using):
            recorded.append(outbox.record(store, undated_run("p-4"), accept=JSON))
            outbox.at_commit(store, lambda: calls.append("publish"))
            raise RuntimeError("the caller's request failed")

    with pytest.raises(RuntimeError):
        request()
    assert recorded == [Recorded.AT_COMMIT]
    assert calls == []


def _broken_broker(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Celery's own publish raises (the broker is down); the tries are listed."""
    from celery import Task

    tries: list[str] = []

    def broken(self: Any, *args: Any, **kwargs: Any) -> None:
        tries.append(str(kwargs.get("task_id") or args[2]))
        raise ConnectionError("broker down")

    monkeypatch.setattr(Task, "apply_async", broken)
    return tries


def _producer(store: Store) -> Any:
    from celery_deadlines import DeadlineTask

    producer = Celery("producer", broker="memory://", backend="cache+memory://")
    producer.conf.update(deadlines_ledger=True, deadlines_database=store.using)
    return producer.task(base=DeadlineTask, name="shop.ship_broken", shared=False)(ship_order)


def test_a_task_whose_publish_fails_outside_a_transaction_tells_its_caller_and_ends_the_run(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ship = _producer(store)
    tries = _broken_broker(monkeypatch)
    with pytest.raises(ConnectionError):
        ship.apply_async(task_id="broken-1", budget=600)
    assert tries == ["broken-1"]
    assert status(store, "broken-1") == (Status.FAILED, "publish_failed")


def test_a_task_whose_publish_fails_after_commit_leaves_the_run_queued_for_the_sweeper(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ship = _producer(store)
    tries = _broken_broker(monkeypatch)
    with transaction.atomic(using=store.using):
        ship.apply_async(task_id="broken-2", budget=600)
        assert tries == []  # not before the commit
    assert tries == ["broken-2"]  # tried at the commit; its failure logged, not raised
    assert status(store, "broken-2") == (Status.QUEUED, "")


def test_reconcile_requeues_a_lapsed_run_and_publishes_its_recorded_message_again(
    store: Store, app: Celery
) -> None:
    record(store, "lapsed")
    claim(store, "lapsed")
    lapse(store, "lapsed")
    report = reconcile_once(app, store)
    assert report.requeued == ["lapsed"]
    [message] = published(app)
    assert message["headers"]["id"] == "lapsed"
    assert message["headers"]["task"] == "shop.ship"
    assert message["headers"]["x_deadline"] == 1.0
    assert message["body"][0] == [7]
    assert status(store, "lapsed") == (Status.QUEUED, "")


def test_a_caller_is_told_of_a_swept_expiry_even_if_the_database_goes_away_right_after(
    store: Store, app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression, nemesis soak seed 202: the sweep's expiry committed, reading the
    # database clock for the refusal failed (a cut), and the caller stayed PENDING.
    from django.db import OperationalError

    record(store, "swept", deadline_in=600)
    Run.objects.using(store.using).filter(task_id="swept").update(
        deadline=store.database_now() - timedelta(seconds=1), op="age"
    )

    def cut() -> Any:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(store, "database_now", cut)
    assert reconcile_once(app, store).expired == ["swept"]
    with pytest.raises(DeadlineRefused) as refused:
        app.AsyncResult("swept").get(timeout=1)
    assert refused.value.reason == "deadline_passed"


def test_reconcile_never_resurrects_a_run_past_its_deadline(store: Store, app: Celery) -> None:
    record(store, "late", deadline_in=600)
    claim(store, "late")
    Run.objects.using(store.using).filter(task_id="late").update(
        deadline=store.database_now() - timedelta(seconds=1),
        lease_expires_at=store.database_now() - timedelta(seconds=2),
        op="age",
    )
    report = reconcile_once(app, store)
    assert report.expired == ["late"]
    assert status(store, "late") == (Status.EXPIRED, "deadline_passed")
    assert published(app) == []
    with pytest.raises(DeadlineRefused) as refused:
        app.AsyncResult("late").get(timeout=1)
    assert refused.value.reason == "deadline_passed"


def test_reconcile_fails_a_run_that_lost_too_many_leases(store: Store, app: Celery) -> None:
    record(store, "crashy")
    claim(store, "crashy")
    lapse(store, "crashy")
    assert reconcile_once(app, store).requeued == ["crashy"]
    claim(store, "crashy")
    lapse(store, "crashy")
    assert reconcile_once(app, store).failed == ["crashy"]  # max_lost_leases = 1
    assert status(store, "crashy") == (Status.FAILED, "worker_lost")


def test_reconcile_hands_a_run_with_an_unresolved_effect_to_effect_reconciliation(
    store: Store, app: Celery
) -> None:
    record(store, "ambiguous")
    lease = claim(store, "ambiguous")
    effects = store.effects
    effects.record_intent(lease, "ambiguous:pay", "pay", "execution", "f")
    assert effects.dispatch(lease, "ambiguous:pay") == 1  # then the worker vanished
    lapse(store, "ambiguous")
    assert reconcile_once(app, store).unknown == ["ambiguous"]
    assert status(store, "ambiguous") == (Status.UNKNOWN, "effect_unresolved")
    caller = app.AsyncResult("ambiguous")  # the caller sees it at once, not PENDING
    assert str(caller.state) == "UNKNOWN"
    assert caller.info["effects"] == ["ambiguous:pay"]
    assert published(app) == []  # no reconciler for the task: an operator resolves it
    assert reconcile_once(app, store).requeued == []  # it waits, pass after pass


def test_a_late_outcome_of_the_lapsed_attempt_releases_its_unknown_run(
    store: Store, app: Celery
) -> None:
    record(store, "late")
    lease = claim(store, "late")
    effects = store.effects
    effects.record_intent(lease, "late:pay", "pay", "execution", "f")
    assert effects.dispatch(lease, "late:pay") == 1
    lapse(store, "late")
    assert reconcile_once(app, store).unknown == ["late"]
    # the paused attempt wakes up and records the provider's reply: it is the truth
    assert effects.succeed(lease, "late:pay", {"paid": 1})
    assert reconcile_once(app, store).requeued == ["late"]  # nothing left to ask
    assert status(store, "late") == (Status.QUEUED, "")
    assert [message["headers"]["id"] for message in published(app)] == ["late"]


def test_two_reconcilers_that_read_one_lapsed_run_settle_it_once(store: Store, app: Celery) -> None:
    record(store, "lapsed")
    lease = claim(store, "lapsed")
    effects = store.effects
    effects.record_intent(lease, "lapsed:pay", "pay", "execution", "f")
    assert effects.dispatch(lease, "lapsed:pay") == 1
    lapse(store, "lapsed")
    [first] = [x for x in store.sweeps.lapsed_leases() if x.task_id == "lapsed"]
    [second] = [x for x in store.sweeps.lapsed_leases() if x.task_id == "lapsed"]  # read alike
    _settle(app, store, first, 5, Report())
    # the first settles it; an operator resolves it as not sent; a new attempt
    # dispatches again: the second reconciler's reading is stale by then
    [seen] = [p for p in effects.pending() if p.task_id == "lapsed"]
    assert effects.settle(seen, False, None, "none", by="operator").applied
    released = effects.release_resolved(seen.run_id)
    assert released is not None
    assert (released.status, released.reason) == (Status.QUEUED, "")
    again = claim(store, "lapsed")
    assert effects.dispatch(again, "lapsed:pay") == 2
    _settle(app, store, second, 5, Report())
    effect = Effect.objects.using(store.using).get(key="lapsed:pay")
    assert (effect.state, effect.dispatches) == ("DISPATCHED", 2)  # not marked UNKNOWN
    assert status(store, "lapsed") == (Status.RUNNING, "")


def test_the_sweeper_expires_unclaimed_runs_and_republishes_forgotten_ones(
    store: Store, app: Celery
) -> None:
    record(store, "forgotten")
    record(store, "expired", deadline_in=600)
    Run.objects.using(store.using).filter(task_id="forgotten").update(
        published_at=store.database_now() - timedelta(seconds=61), op="age"
    )
    Run.objects.using(store.using).filter(task_id="expired").update(
        deadline=store.database_now() - timedelta(seconds=1), op="age"
    )
    report = reconcile_once(app, store)
    assert (report.republished, report.expired) == (["forgotten"], ["expired"])
    assert [m["headers"]["id"] for m in published(app)] == ["forgotten"]
    assert status(store, "expired") == (Status.EXPIRED, "deadline_passed")
    assert reconcile_once(app, store).republished == []  # not again before the interval


def ship_order() -> None:
    """A task body (never run here)."""


QUEUES = ("orders", "urgent", "elsewhere")


def test_a_run_republished_by_a_worker_with_another_default_queue_goes_to_its_own_queue(
    store: Store,
) -> None:
    from celery_deadlines import DeadlineTask

    # queues of this test's own: kombu's memory transport is one per process, and
    # another test's messages may wait in an "orders" queue
    orders, urgent, elsewhere = (f"{name}-{uuid.uuid4().hex[:8]}" for name in QUEUES)
    producer = Celery("producer", broker="memory://", backend="cache+memory://")
    producer.conf.update(
        task_default_queue=orders, deadlines_ledger=True, deadlines_database=store.using
    )
    ship = producer.task(base=DeadlineTask, name="shop.ship_routed", shared=False)(ship_order)
    ship.apply_async(task_id="routed-1", budget=600)
    ship.apply_async(task_id="routed-2", budget=600, queue=urgent)
    assert [m["headers"]["id"] for m in drain(producer, orders)] == ["routed-1"]
    assert [m["headers"]["id"] for m in drain(producer, urgent)] == ["routed-2"]
    # the queue is on the run's record too (the admin filters on it)
    runs = Run.objects.using(store.using)
    assert [runs.get(task_id=t).queue for t in ("routed-1", "routed-2")] == [orders, urgent]

    # a worker whose own default queue is another one finds the message lost and
    # publishes it again from the outbox: it goes where the producer sent it
    worker = Celery("worker", broker="memory://", backend="cache+memory://")
    worker.conf.update(task_default_queue=elsewhere)
    run_id = Run.objects.using(store.using).get(task_id="routed-1").pk
    assert operations.republish(worker, store, run_id)
    assert drain(worker, elsewhere) == []
    assert [m["headers"]["id"] for m in drain(worker, orders)] == ["routed-1"]
    producer.close()
    worker.close()
