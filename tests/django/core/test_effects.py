"""The effect ledger on SQLite and PostgreSQL: intent, the dispatch guard, outcomes,
replay and reconciliation, driven through ``EffectScope`` as a task body drives it.

Time is the database's; a test *ages* a run (moves its stored instants into the past)
instead of waiting, and the history shows it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Ignore, Reject
from django.db import connections
from django.test.utils import CaptureQueriesContext

from celery_deadlines import DeadlineTask
from celery_deadlines.core.effects import EffectScope, Found, NotFound, PendingEffect
from celery_deadlines.core.finishing import end_after_body
from celery_deadlines.errors import DispatchRefused, EffectConflict, StaleLease
from celery_deadlines.ledger import outbox
from celery_deadlines.ledger.attempt import Attempt
from celery_deadlines.ledger.reconcile import reconcile_once
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.ledger.sql.rows import ClaimRefused, Lease, NewRun
from celery_deadlines.models import Effect, EffectState, Run, RunEvent, Status
from celery_deadlines.rules.observations import ActionClass, Observation
from celery_deadlines.testing import FakeClock, use_clock
from tests.conftest import service_unavailable
from tests.django.conftest import DATABASES
from tests.support.memory_queue import drain
from tests.support.processes import reachable

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgres"])

TTL = timedelta(seconds=30)


class ProviderTimeout(Exception):
    pass


@pytest.fixture(params=DATABASES)
def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "postgres" and not reachable("127.0.0.1", 5432):
        service_unavailable("PostgreSQL 127.0.0.1:5432")
    return Store(request.param)


def record(store: Store, task_id: str = "charge-1", deadline_in: float = 600) -> None:
    body, content_type, encoding = outbox.encode_message("json", [42], {}, {})
    deadline = store.database_now() + timedelta(seconds=deadline_in)
    store.outbox.enqueue(
        NewRun(
            task_id=task_id,
            task_name="shop.charge",
            deadline=deadline,
            root_id=task_id,
            message_body=body,
            content_type=content_type,
            content_encoding=encoding,
        )
    )


def attempt(store: Store, owner: str, task_id: str = "charge-1") -> Attempt:
    lease = store.runs.claim(
        task_id,
        0,
        task_name="shop.charge",
        owner=owner,
        ttl=TTL,
        reserve=timedelta(0),
        max_lost_leases=10,
    )
    assert isinstance(lease, Lease), lease
    return Attempt(store, lease, owner, TTL)


def lapse(store: Store, task_id: str = "charge-1", deadline_too: bool = False) -> None:
    past = store.database_now() - timedelta(seconds=2)
    changes: dict[str, Any] = {"lease_expires_at": past, "op": "age"}
    if deadline_too:
        changes["deadline"] = past
    Run.objects.using(store.using).filter(task_id=task_id).update(**changes)


def charge(current: Attempt, amount: int = 100, **options: Any) -> EffectScope:
    return EffectScope(
        current,
        "charge",
        "order-42:charge:v1",
        {"amount": amount},
        not_sent=options.get("not_sent", (ConnectionRefusedError,)),
        evidence=options.get("evidence", ()),
        action=options.get("action"),
        required=options.get("required", ()),
    )


def effect(store: Store) -> Effect:
    return Effect.objects.using(store.using).get(key="order-42:charge:v1")


def test_an_effect_is_dispatched_once_and_its_result_replayed_to_a_later_attempt(
    store: Store,
) -> None:
    record(store)
    first = attempt(store, "w1:1")
    with charge(first) as fx:
        assert not fx.completed
        assert fx.token == 1
        fx.succeed({"charge": "ch_1"})
    lapse(store)
    second = attempt(store, "w2:2")
    with charge(second) as fx:
        assert fx.completed
        assert fx.result == {"charge": "ch_1"}
    assert (effect(store).state, effect(store).dispatches) == (EffectState.SUCCEEDED, 1)


def test_the_same_key_with_other_parameters_is_refused(store: Store) -> None:
    record(store)
    first = attempt(store, "w1:1")
    with charge(first, amount=100) as fx:
        fx.succeed("ch_1")
    with pytest.raises(EffectConflict, match="other parameters"), charge(first, amount=999):
        pass


def test_a_stale_attempt_cannot_pass_the_dispatch_guard(store: Store) -> None:
    record(store)
    stale = attempt(store, "w1:1")
    lapse(store)
    attempt(store, "w2:2")
    with pytest.raises(DispatchRefused) as refused, charge(stale):
        pytest.fail("the call must not be made")
    assert refused.value.reason == "stale_lease"
    assert effect(store).state == EffectState.INTENT_RECORDED
    rejected = RunEvent.objects.using(store.using).get(kind="dispatch", outcome="rejected")
    assert (rejected.lease_token, rejected.owner) == (1, "w1:1")


def test_the_dispatch_guard_refuses_once_the_deadline_has_passed(store: Store) -> None:
    record(store)
    late = attempt(store, "w1:1")
    lapse(store, deadline_too=True)
    with pytest.raises(DispatchRefused) as refused, charge(late):
        pytest.fail("the call must not be made")
    assert refused.value.reason == "deadline_passed"


def test_a_request_that_certainly_never_left_may_be_dispatched_again(store: Store) -> None:
    record(store)
    first = attempt(store, "w1:1")
    with pytest.raises(ConnectionRefusedError), charge(first):
        raise ConnectionRefusedError("provider down")
    assert effect(store).state == EffectState.NOT_DISPATCHED
    assert first.unresolved == set()
    lapse(store)
    second = attempt(store, "w2:2")
    with charge(second) as fx:
        fx.succeed("ch_2")
    assert (effect(store).state, effect(store).dispatches, effect(store).lease_token) == (
        EffectState.SUCCEEDED,
        2,
        second.lease.token,
    )


def test_an_ambiguous_failure_records_unknown_and_blocks_every_new_dispatch(
    store: Store,
) -> None:
    record(store)
    first = attempt(store, "w1:1")
    with pytest.raises(ProviderTimeout), charge(first):
        raise ProviderTimeout("read timed out")
    assert effect(store).state == EffectState.UNKNOWN
    assert first.unresolved == {"order-42:charge:v1"}
    with pytest.raises(DispatchRefused) as refused, charge(first):
        pytest.fail("the call must not be made")
    assert refused.value.reason == "unresolved"


def test_intent_and_guard_cost_two_statements_and_the_outcome_one_on_postgresql(
    store: Store,
) -> None:
    if store.dialect.vendor != "postgresql":
        pytest.skip("round trips are counted on PostgreSQL")
    record(store)
    current = attempt(store, "w1:1")
    scope = charge(current)
    connection = connections[store.using]
    with CaptureQueriesContext(connection) as entering:
        scope.__enter__()
    with CaptureQueriesContext(connection) as recording:
        scope.succeed("ch_1")
    assert (len(entering), len(recording)) == (2, 1)


effects_app = Celery("effects-test", broker="memory://", backend="cache+memory://")
effects_app.conf.update(task_default_queue="fx", deadlines_ledger=False)


@effects_app.task(base=DeadlineTask, bind=True, name="shop.charge")
def shop_charge(self: DeadlineTask) -> None:
    raise AssertionError("the reconciler tests never run the body")


@pytest.fixture
def app() -> Iterator[Celery]:
    """The app the reconciler republishes with; its task starts with no reconciler."""
    shop_charge.__dict__.pop("_effect_reconcilers", None)
    published(effects_app)
    yield effects_app
    shop_charge.__dict__.pop("_effect_reconcilers", None)


def published(app: Celery) -> list[str]:
    """The ids of the messages waiting in the in-memory queue ``fx`` (drained)."""
    return [message["headers"]["id"] for message in drain(app, "fx")]


def crash_after_dispatch(store: Store) -> None:
    """An attempt dispatches, then its worker dies: no outcome recorded, lease lapses."""
    record(store)
    scope = charge(attempt(store, "w1:1"))
    scope.__enter__()
    lapse(store)


@pytest.mark.parametrize(
    ("answer", "state"),
    [
        (Found({"charge": "ch_7"}, evidence="provider lookup: ch_7"), EffectState.SUCCEEDED),
        (NotFound(evidence="provider lookup: no charge"), EffectState.NOT_DISPATCHED),
    ],
    ids=["found", "not-found"],
)
def test_a_crash_after_dispatch_is_reconciled_with_the_provider_before_the_run_runs_again(
    store: Store, app: Celery, answer: Any, state: str
) -> None:
    asked: list[PendingEffect] = []

    def lookup(pending: PendingEffect) -> Any:
        asked.append(pending)
        return answer

    shop_charge.reconciler("charge")(lookup)
    crash_after_dispatch(store)
    report = reconcile_once(app, store)  # one pass: UNKNOWN, asked, resolved, requeued
    assert report.unknown == ["charge-1"]
    assert [p.key for p in asked] == ["order-42:charge:v1"]
    assert (report.resolved, report.requeued) == (["order-42:charge:v1"], ["charge-1"])
    assert reconcile_once(app, store).resolved == []  # asked once, not again
    assert effect(store).state == state
    assert effect(store).evidence == answer.evidence
    assert Run.objects.using(store.using).get(task_id="charge-1").status == Status.QUEUED
    assert published(app) == ["charge-1"]
    replay = attempt(store, "w2:2")
    if state == EffectState.SUCCEEDED:
        with charge(replay) as fx:
            assert (fx.completed, fx.result) == (True, {"charge": "ch_7"})
    else:
        with charge(replay) as fx:
            assert not fx.completed  # safe to dispatch again, under the new token
            fx.succeed("ch_8")
        assert effect(store).dispatches == 2


def test_without_a_reconciler_an_unknown_effect_waits_for_an_operator(
    store: Store, app: Celery
) -> None:
    crash_after_dispatch(store)
    reconcile_once(app, store)
    reconcile_once(app, store)
    assert effect(store).state == EffectState.UNKNOWN
    assert Run.objects.using(store.using).get(task_id="charge-1").status == Status.UNKNOWN


def test_a_redelivery_cannot_claim_a_lapsed_run_before_its_dispatched_effect_is_reconciled(
    store: Store, app: Celery
) -> None:
    # found by the crash-point sweep: a broker redelivery raced the reconciler to a run
    # whose pool process died between the call and recording its outcome, and the new
    # attempt failed on the unresolved effect instead of waiting for reconciliation
    crash_after_dispatch(store)
    refused = store.runs.claim(
        "charge-1",
        0,
        task_name="shop.charge",
        owner="w2:2",
        ttl=TTL,
        reserve=timedelta(0),
        max_lost_leases=10,
    )
    assert isinstance(refused, ClaimRefused)
    assert refused.why == ClaimRefused.UNRESOLVED
    assert effect(store).state == EffectState.DISPATCHED
    reconcile_once(app, store)  # no reconciler: UNKNOWN, for an operator
    assert Run.objects.using(store.using).get(task_id="charge-1").status == Status.UNKNOWN


@pytest.mark.parametrize(
    "raised",
    [Reject("busy", requeue=True), Reject("bad"), Ignore(), RuntimeError("boom")],
    ids=["reject-requeue", "reject", "ignore", "error"],
)
def test_a_body_that_raises_anything_with_an_unresolved_effect_ends_its_run_unknown(
    store: Store, raised: BaseException
) -> None:
    record(store)
    current = attempt(store, "w1:1")
    scope = charge(current)
    scope.__enter__()  # dispatched; the body then raises before any outcome is known
    with pytest.raises(Ignore):  # the run is UNKNOWN; Celery stores nothing over it
        end_after_body(current, raised)
    assert effect(store).state == EffectState.DISPATCHED  # for the reconciler to settle
    run = Run.objects.using(store.using).get(task_id="charge-1")
    assert (run.status, run.reason) == (Status.UNKNOWN, "effect_unresolved")


def test_an_outcome_is_fenced_by_the_run_as_well_as_its_token(store: Store, app: Celery) -> None:
    # tokens count per run: a second run sharing the key (a duplicate order) can hold the
    # same token number as the stale first one; only the pair (run, token) is the holder
    shop_charge.reconciler("charge")(lambda pending: NotFound(evidence="no charge"))
    record(store)
    stale = charge(attempt(store, "w1:1"))
    stale.__enter__()  # dispatched by run charge-1 under token 1; then its worker stalls
    lapse(store)
    reconcile_once(app, store)  # UNKNOWN, then not found: safe to dispatch again
    record(store, "charge-2")
    duplicate = attempt(store, "w2:1", "charge-2")
    assert duplicate.lease.token == 1
    with charge(duplicate) as fx:
        with pytest.raises(StaleLease, match="moved on since this attempt's dispatch 1") as no:
            stale.succeed("ch_stale")  # same key, same token number, another run
        assert "is now dispatch 2 (DISPATCHED" in str(no.value)
        fx.succeed("ch_2")
    # the per-key fence still tells the two dispatches apart, for a fencing provider
    assert (stale.fence, fx.fence) == (1, 2)
    assert (effect(store).result, effect(store).run.task_id) == ("ch_2", "charge-2")


def test_a_duplicate_run_never_dispatches_a_key_in_flight_and_ends_with_that_reason(
    store: Store,
) -> None:
    record(store)
    charge(attempt(store, "w1:1")).__enter__()  # run charge-1's call is in flight
    record(store, "charge-2")  # the same order submitted twice: the same effect key
    duplicate = attempt(store, "w2:1", "charge-2")
    with pytest.raises(DispatchRefused) as refused, charge(duplicate):
        pytest.fail("the call must not be made")
    assert refused.value.reason == "unresolved"
    end_after_body(duplicate, refused.value)
    run = Run.objects.using(store.using).get(task_id="charge-2")
    assert (run.status, run.reason) == (Status.FAILED, "dispatch_refused")
    assert effect(store).dispatches == 1


def test_a_dispatch_refused_by_the_deadline_is_settled_expired_by_the_reconciler(
    store: Store, app: Celery
) -> None:
    record(store)
    current = attempt(store, "w1:1")
    lapse(store, deadline_too=True)  # the lease is capped at the deadline: both passed
    with pytest.raises(DispatchRefused) as refused, charge(current):
        pytest.fail("the call must not be made")
    assert refused.value.reason == "deadline_passed"
    with pytest.raises(StaleLease):  # the attempt can no longer write its end...
        end_after_body(current, refused.value)
    assert reconcile_once(app, store).expired == ["charge-1"]  # ...the reconciler does
    run = Run.objects.using(store.using).get(task_id="charge-1")
    assert (run.status, run.reason) == (Status.EXPIRED, "deadline_passed")


def test_no_gate_or_operator_ends_or_requeues_a_run_whose_effect_awaits_reconciliation(
    store: Store,
) -> None:
    # found in review: a refused claim (lost leases, deadline) or an operator's requeue
    # could end or queue such a run, leaving its effect DISPATCHED for good
    crash_after_dispatch(store)
    refused = store.runs.claim(
        "charge-1",
        0,
        task_name="shop.charge",
        owner="w2:2",
        ttl=TTL,
        reserve=timedelta(0),
        max_lost_leases=0,
    )
    assert isinstance(refused, ClaimRefused)
    assert refused.why == ClaimRefused.UNRESOLVED  # not lost_leases: nothing may end it
    assert not store.runs.refuse(
        "charge-1",
        "shop.charge",
        0,
        status=Status.EXPIRED,
        reason="deadline_passed",
        detail="gate",
        deadline=None,
    )
    run = Run.objects.using(store.using).get(task_id="charge-1")
    assert not store.operator.requeue_now(run.id, "operator")
    # nor its expiry: an EXPIRED run's effect is never asked about again, so it would
    # stay DISPATCHED for good (found in review of the purge: such a run is never purged)
    assert store.operator.expire_now(run.id, "operator") is None
    run.refresh_from_db()
    assert run.status == Status.RUNNING
    assert effect(store).state == EffectState.DISPATCHED


def test_a_lapsed_run_past_its_deadline_is_reconciled_before_it_ends_expired(
    store: Store, app: Celery
) -> None:
    shop_charge.reconciler("charge")(lambda pending: Found("ch_9", evidence="lookup: ch_9"))
    record(store)
    charge(attempt(store, "w1:1")).__enter__()
    lapse(store, deadline_too=True)
    report = reconcile_once(app, store)  # UNKNOWN first, then asked, then EXPIRED
    assert (report.unknown, report.resolved, report.expired) == (
        ["charge-1"],
        ["order-42:charge:v1"],
        ["charge-1"],
    )
    run = Run.objects.using(store.using).get(task_id="charge-1")
    # the charge happened: the run ended past its deadline after it, not merely late
    assert (run.status, run.reason) == (Status.EXPIRED, "performed_past_deadline")
    assert (effect(store).state, effect(store).evidence) == (EffectState.SUCCEEDED, "lookup: ch_9")
    assert published(app) == []  # never resurrected


def order_state(current: Attempt, observed: datetime, expires: datetime) -> Observation:
    return Observation("order_state", "editable", observed, expires, "ev-1", current.lease.token)


def test_the_guard_refuses_evidence_the_database_clock_says_is_stale(store: Store) -> None:
    record(store)
    current = attempt(store, "w1:1")
    now = store.database_now()
    evidence = order_state(current, now - timedelta(seconds=60), now - timedelta(seconds=1))
    # the worker's clock is ten minutes behind: by its own reading the evidence is fresh
    with use_clock(FakeClock(now - timedelta(minutes=10))):
        scope = charge(current, evidence=[evidence], action=ActionClass.RECOMMEND)
        with pytest.raises(DispatchRefused) as refused, scope:
            pytest.fail("the call must not be made")
    assert refused.value.reason == "stale_evidence"
    assert effect(store).state == EffectState.INTENT_RECORDED  # planned, not dispatched
    rejected = RunEvent.objects.using(store.using).get(kind="dispatch", outcome="rejected")
    assert rejected.detail.startswith("stale_evidence")


def test_evidence_the_worker_sees_as_stale_is_refused_with_its_reasons(store: Store) -> None:
    record(store)
    current = attempt(store, "w1:1")
    now = store.database_now()
    old = order_state(current, now - timedelta(minutes=6), now - timedelta(minutes=5))
    with use_clock(FakeClock(now)):
        scope = charge(current, evidence=[old], action=ActionClass.COMMIT, required=["order_state"])
        with pytest.raises(DispatchRefused, match="order_state: expired at"), scope:
            pytest.fail("the call must not be made")
    rejected = RunEvent.objects.using(store.using).get(kind="dispatch", outcome="rejected")
    assert rejected.detail.startswith("stale_evidence:order-42:charge:v1: order_state: expired")


def test_fresh_evidence_passes_the_guard_in_the_same_statements(store: Store) -> None:
    record(store)
    current = attempt(store, "w1:1")
    now = store.database_now()
    evidence = order_state(current, now, now + timedelta(seconds=30))
    scope = charge(current, evidence=[evidence], action=ActionClass.COMMIT)
    with use_clock(FakeClock(now)), scope as fx:
        assert fx.fence == 1
        fx.succeed("ok")
    assert effect(store).state == EffectState.SUCCEEDED


def test_a_deadline_refusal_ends_a_run_only_if_the_database_clock_agrees(store: Store) -> None:
    # a worker whose clock ran ahead refuses a message as expired: the ledger, which
    # still sees a minute left, keeps the run for a worker with a sound clock
    record(store, "in-time", deadline_in=60)

    def refuse(task_id: str) -> bool:
        return bool(
            store.runs.refuse(
                task_id,
                "shop.charge",
                0,
                status=Status.EXPIRED,
                reason="deadline_passed",
                detail="claim gate",
                deadline=None,
                confirm_within=timedelta(0),
            )
        )

    assert not refuse("in-time")
    assert Run.objects.using(store.using).get(task_id="in-time").status == Status.QUEUED
    record(store, "late", deadline_in=-1)
    assert refuse("late")
    assert Run.objects.using(store.using).get(task_id="late").status == Status.EXPIRED
