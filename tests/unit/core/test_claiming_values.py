"""The claim takes values and returns an outcome; the task ends an unrun delivery.

:func:`celery_deadlines.core.claiming.claim` is given a
:class:`~celery_deadlines.core.claiming.Claim` (no task) and answers with the attempt or a
value saying how the delivery ends unrun; ``DeadlineTask.before_start`` turns that value
into Celery's ``Ignore`` or ``Reject``, or into the stored refusal. Run against the
in-memory ledger on a fake clock.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from celery.app.task import Context

from celery_deadlines import DeadlineTask
from celery_deadlines.core import claiming, recording
from celery_deadlines.errors import DeadlineRefused, LedgerUnreachable
from celery_deadlines.rules import gates
from celery_deadlines.testing import FakeClock, FakeLedger, use_ledger
from tests.support.memory_queue import drain
from tests.support.trace import execute

QUEUE = "claiming-values"


@pytest.fixture
def ledger() -> Iterator[FakeLedger]:
    with use_ledger(FakeLedger()) as fake:
        yield fake


@pytest.fixture
def app(ledger: FakeLedger, clock: FakeClock) -> Iterator[Celery]:
    app = Celery(f"claim-{uuid.uuid4().hex[:6]}", broker="memory://", backend="cache+memory://")
    app.conf.update(task_default_queue=QUEUE, deadlines_lease_ttl=30)
    drain(app, QUEUE)
    yield app
    app.close()


def caller(app: Celery, *, stores_errors: bool = True) -> claiming.ResultPolicy:
    return claiming.ResultPolicy(
        app=app,
        backend=app.backend,
        task_name="values.work",
        stores_errors=stores_errors,
        ignores_result=False,
    )


def delivery(
    app: Celery,
    task_id: str,
    deadline: datetime | None,
    *,
    hostname: str = "w1@test",
    requeue: bool = True,
) -> claiming.Claim:
    """A claim of a message published by name (its run is recorded from the request)."""
    request = Context(id=task_id, retries=0, hostname=hostname, args=[], kwargs={})
    return claiming.Claim(
        policy=caller(app),
        sender=None,
        task_id=task_id,
        request=request,
        deadline=deadline,
        lease=timedelta(seconds=30),
        reserve=timedelta(seconds=1),
        serializer="json",
        requeue=requeue,
    )


def test_a_won_claim_returns_the_attempt_holding_the_runs_lease(
    app: Celery, ledger: FakeLedger, clock: FakeClock
) -> None:
    attempt = claiming.claim(delivery(app, "v1", clock.now() + timedelta(minutes=1)))
    assert not isinstance(attempt, claiming.NOT_RUN)
    assert (attempt.lease.task_id, attempt.lease.token) == ("v1", 1)
    assert (ledger.run("v1").status, ledger.run("v1").task_name) == ("RUNNING", "values.work")


def test_a_claim_refused_for_the_deadline_returns_the_ledgers_refusal_and_stores_nothing(
    app: Celery, ledger: FakeLedger, clock: FakeClock
) -> None:
    deadline = clock.now() - timedelta(seconds=1)
    outcome = claiming.claim(delivery(app, "v2", deadline))
    assert isinstance(outcome, claiming.Refused)
    decision = outcome.decision
    assert (decision.gate, decision.reason) == (gates.Gate.CLAIM, gates.Reason.DEADLINE_PASSED)
    assert (decision.deadline, decision.clock_reading) == (deadline, clock.now())
    # what is stored and recorded is the task's to do with the refusal
    assert app.AsyncResult("v2").state == "PENDING"
    assert ledger.run("v2").status == "QUEUED"


def test_a_delivery_of_a_run_another_worker_holds_is_not_run_and_says_why(
    app: Celery, ledger: FakeLedger, clock: FakeClock
) -> None:
    deadline = clock.now() + timedelta(minutes=1)
    claiming.claim(delivery(app, "v3", deadline))
    outcome = claiming.claim(delivery(app, "v3", deadline, hostname="w2@test"))
    assert isinstance(outcome, claiming.NotRun)
    assert outcome.why.startswith("claim refused: ")
    assert ledger.run("v3").owner == "w1@test:fake"


def test_a_claim_that_cannot_reach_the_ledger_returns_the_error_and_whether_to_requeue(
    app: Celery, ledger: FakeLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    unreachable = LedgerUnreachable("v4", 30.0, "connection refused")

    def claim_run(*_: Any, **__: Any) -> Any:
        raise unreachable

    monkeypatch.setattr(ledger, "claim_run", claim_run)
    assert claiming.claim(delivery(app, "v4", None)) == claiming.Unreachable(unreachable, True)
    early = claiming.claim(delivery(app, "v4", None, requeue=False))
    assert early == claiming.Unreachable(unreachable, False)


@pytest.mark.parametrize(
    ("task_ignores", "request_ignores", "even_if_ignored", "stores", "ignores"),
    [
        (False, None, False, True, False),
        (True, None, False, False, True),
        (True, None, True, True, True),
        (True, False, False, True, False),  # the request's ignore_result comes first
        (False, True, False, False, True),
    ],
)
def test_the_caller_of_a_delivery_is_stored_to_by_celerys_rule(
    app: Celery,
    task_ignores: bool,
    request_ignores: bool | None,
    even_if_ignored: bool,
    stores: bool,
    ignores: bool,
) -> None:
    @app.task(
        base=DeadlineTask,
        name="values.rule",
        shared=False,
        ignore_result=task_ignores,
        store_errors_even_if_ignored=even_if_ignored,
    )
    def rule() -> None: ...

    rule.push_request(id="v8", ignore_result=request_ignores)  # the delivery's request
    try:
        told = claiming.result_policy(rule)
    finally:
        rule.pop_request()
    assert (told.task_name, told.stores_errors, told.ignores_result) == (
        "values.rule",
        stores,
        ignores,
    )


def test_a_refusal_for_the_deadline_is_confirmed_with_the_reserve_and_any_other_without(
    app: Celery, ledger: FakeLedger, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    confirmed: list[timedelta | None] = []

    def refuse_run(*_: Any, confirm_within: timedelta | None, **__: Any) -> bool:
        confirmed.append(confirm_within)
        return True

    monkeypatch.setattr(ledger, "refuse_run", refuse_run)
    now = clock.now()
    passed = gates.admit(gates.Gate.CLAIM, now - timedelta(seconds=1), now, gates.ZERO)
    unreadable = gates.invalid(gates.Gate.CLAIM, now, "unreadable deadline header 'soon'")
    for decision, reserve in [(passed, timedelta(seconds=3)), (unreadable, timedelta(seconds=3))]:
        assert recording.record_refusal(
            app, decision, task_name="values.work", task_id="v5", retries=0, reserve=reserve
        )
    assert confirmed == [timedelta(seconds=3), None]


# -- the task ends what the claim did not run, in Celery's terms --------------------------


def work_task(app: Celery, *, acks_late: bool) -> Any:
    @app.task(base=DeadlineTask, name="values.work", budget=60, shared=False, acks_late=acks_late)
    def work() -> str:
        return "ran"

    return work


@pytest.mark.parametrize(("acks_late", "state"), [(True, "REJECTED"), (False, "FAILURE")])
def test_a_delivery_whose_claim_cannot_reach_the_ledger_is_handed_back_only_when_acked_late(
    app: Celery,
    ledger: FakeLedger,
    monkeypatch: pytest.MonkeyPatch,
    acks_late: bool,
    state: str,
) -> None:
    def claim_run(*_: Any, task_id: str, **__: Any) -> Any:
        raise LedgerUnreachable(task_id, 30.0, "connection refused")

    work_task(app, acks_late=acks_late).apply_async(task_id="v6")
    monkeypatch.setattr(ledger, "claim_run", claim_run)
    [message] = drain(app, QUEUE)
    told, raised = execute(app, message)
    assert told == state
    if acks_late:  # back to the broker: nothing stored for the caller
        assert app.AsyncResult("v6").state == "PENDING"
    else:
        assert isinstance(raised, LedgerUnreachable)
        assert isinstance(app.AsyncResult("v6").result, LedgerUnreachable)


def test_a_delivery_the_ledgers_clock_refuses_stores_the_refusal_and_ends_the_run_expired(
    app: Celery, ledger: FakeLedger, clock: FakeClock
) -> None:
    work_task(app, acks_late=True).apply_async(task_id="v7")
    [message] = drain(app, QUEUE)
    ledger.run("v7").deadline = clock.now() - timedelta(seconds=1)  # by the ledger's clock
    assert execute(app, message)[0] == "IGNORED"
    refused = app.AsyncResult("v7").result
    assert isinstance(refused, DeadlineRefused)
    assert (refused.gate, refused.reason) == ("claim", "deadline_passed")
    assert (ledger.run("v7").status, ledger.run("v7").reason) == ("EXPIRED", "deadline_passed")


def test_a_delivery_the_ledgers_clock_refuses_whose_deadline_was_its_expires_is_told_revoked(
    app: Celery, ledger: FakeLedger, clock: FakeClock
) -> None:
    from celery.exceptions import TaskRevokedError

    work_task(app, acks_late=True).apply_async(task_id="v8", expires=30)  # earlier than 60
    [message] = drain(app, QUEUE)
    assert message["headers"]["x_deadline_source"] == "expires"
    ledger.run("v8").deadline = clock.now() - timedelta(seconds=1)  # by the ledger's clock
    assert execute(app, message)[0] == "IGNORED"
    result = app.AsyncResult("v8")
    assert str(result.state) == "REVOKED"
    assert isinstance(result.result, TaskRevokedError)
    assert str(result.result) == "expired"
    # the ledger keeps the reason
    assert (ledger.run("v8").status, ledger.run("v8").reason) == ("EXPIRED", "deadline_passed")


@pytest.mark.parametrize(("source", "state"), [("expires", "REVOKED"), ("default", "FAILURE")])
def test_a_waiting_caller_of_a_run_that_expired_is_told_as_the_run_was_refused(
    app: Celery, ledger: FakeLedger, clock: FakeClock, source: str, state: str
) -> None:
    # the worker that ended the run died before telling its caller: a later delivery
    # of it tells the caller what that worker would have
    task_id = f"v9-{source}"  # Celery's memory backend is one for every app
    work_task(app, acks_late=True).apply_async(task_id=task_id)
    drain(app, QUEUE)
    run = ledger.run(task_id)
    run.status, run.reason = "EXPIRED", "deadline_passed"
    claiming.answer_a_waiting_caller(caller(app), task_id, clock.now(), source=source)
    assert app.AsyncResult(task_id).state == state
