"""An attempt's claim and last write through a database connection that is lost
meanwhile (the nemesis soak, seeds 101 and 6161): the body's outcome is not the
connection's error, and a caller is not told a failure of a run that has not run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Reject
from django.db import InterfaceError, OperationalError, ProgrammingError

from celery_deadlines import DeadlineTask, LedgerUnreachable, RunFailed
from celery_deadlines.errors import StaleLease
from celery_deadlines.explain import facts, render_text
from celery_deadlines.ledger import patience
from celery_deadlines.ledger.attempt import Attempt
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.ledger.sql.runs import Runs
from celery_deadlines.models import Run, RunEvent, Status
from celery_deadlines.testing import FakeClock
from tests.django.ledger.sql.test_ledger_store import claim, new_run, won
from tests.support.memory_queue import drain
from tests.support.trace import execute, execute_next

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

TTL = timedelta(seconds=30)


@pytest.fixture
def attempt(monkeypatch: pytest.MonkeyPatch) -> Attempt:
    monkeypatch.setattr(patience, "RETRY_INTERVAL", 0)
    store = Store("default")
    assert store.outbox.enqueue(new_run())
    return Attempt(store, won(claim(store)), "w1:1", TTL)


def cut_once(monkeypatch: pytest.MonkeyPatch, attempt: Attempt, before: Callable[[], Any]) -> None:
    """The first ``finish`` runs ``before`` and then loses the connection."""
    runs = attempt.store.runs
    real = runs.finish
    calls: list[int] = []

    def finish(*args: Any, **kwargs: Any) -> bool:
        calls.append(1)
        if len(calls) == 1:
            before()
            raise OperationalError("consuming input failed: server closed the connection")
        return real(*args, **kwargs)

    monkeypatch.setattr(runs, "finish", finish)


def applied(kind: str) -> int:
    return RunEvent.objects.filter(run__task_id="run-1", kind=kind, outcome="applied").count()


def test_a_success_whose_commit_answer_was_lost_is_not_written_twice_or_failed(
    attempt: Attempt, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = attempt.store.runs.finish
    cut_once(monkeypatch, attempt, lambda: real(attempt.lease, attempt.owner, Status.SUCCEEDED))
    attempt.succeed()  # no error: the write had committed
    assert Run.objects.get(task_id="run-1").status == "SUCCEEDED"
    assert (applied("succeeded"), applied("failed")) == (1, 0)


def test_a_success_write_the_cut_lost_is_written_again(
    attempt: Attempt, monkeypatch: pytest.MonkeyPatch
) -> None:
    cut_once(monkeypatch, attempt, lambda: None)
    attempt.succeed()
    assert Run.objects.get(task_id="run-1").status == "SUCCEEDED"
    assert applied("succeeded") == 1


def test_a_run_taken_over_while_the_database_was_away_is_left_to_its_new_holder(
    attempt: Attempt, monkeypatch: pytest.MonkeyPatch
) -> None:
    def taken_over() -> None:
        Run.objects.filter(task_id="run-1").update(lease_token=attempt.lease.token + 1)

    cut_once(monkeypatch, attempt, taken_over)
    with pytest.raises(StaleLease):
        attempt.succeed()
    assert Run.objects.get(task_id="run-1").status == "RUNNING"


def cut_retry_once(
    monkeypatch: pytest.MonkeyPatch, runs: Runs | type[Runs], before: Callable[[], Any]
) -> None:
    """The first ``retry`` write runs ``before`` and then loses the connection."""
    real = runs.retry
    calls: list[int] = []

    def retry(*args: Any, **kwargs: Any) -> bool:
        calls.append(1)
        if len(calls) == 1:
            before()
            raise OperationalError("consuming input failed: server closed the connection")
        return real(*args, **kwargs)

    monkeypatch.setattr(runs, "retry", retry)


def test_a_retry_write_a_database_restart_lost_is_written_again(
    attempt: Attempt, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 2525 of the nemesis soak: a PostgreSQL restart during a retry's write ended
    the run FAILED ``rejected`` (Celery rejects a message whose retry it cannot publish)."""
    cut_retry_once(monkeypatch, attempt.store.runs, lambda: None)
    attempt.retry(1, None, b"{}", "retries=1")
    run = Run.objects.get(task_id="run-1")
    assert (run.status, run.retries) == ("RETRYING", 1)
    assert applied("retry") == 1


def test_a_retry_whose_commit_answer_was_lost_is_not_written_twice_or_refused(
    attempt: Attempt, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = attempt.store.runs
    real = runs.retry
    cut_retry_once(
        monkeypatch,
        runs,
        lambda: real(
            attempt.lease,
            attempt.owner,
            retries=1,
            available_at=None,
            message_body=b"{}",
            detail="retries=1",
        ),
    )
    attempt.retry(1, None, b"{}", "retries=1")  # no StaleLease: the write had committed
    assert Run.objects.get(task_id="run-1").status == "RETRYING"
    assert applied("retry") == 1


# -- the claim: a blip is waited out; a longer outage hands the message back ---------------

QUEUE = "lost-answers"


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Celery, list[str]]]:
    """An app on the ``default`` ledger whose task records what its body ran."""
    monkeypatch.setattr(patience, "RETRY_INTERVAL", 0)
    app = Celery("lost-claims", broker="memory://", backend="cache+memory://")
    app.conf.update(
        task_default_queue=QUEUE, deadlines_ledger=True, deadlines_lease_ttl=30, task_acks_late=True
    )
    ran: list[str] = []

    @app.task(base=DeadlineTask, bind=True, name="lost.claim", budget=600, shared=False)
    def work(self: DeadlineTask) -> str:
        ran.append(self.request.id)
        return "done"

    drain(app, QUEUE)
    yield app, ran
    drain(app, QUEUE)
    app.close()


def claim_unreachable(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock, times: int, error: type[Exception]
) -> list[int]:
    """The claim statement meets ``error`` ``times`` times, each after 10 s on ``clock``."""
    real = Runs.claim
    calls: list[int] = []

    def claim(self: Runs, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) <= times:
            clock.advance(10)
            raise error("connection to server at 127.0.0.1 failed: Connection refused")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Runs, "claim", claim)
    return calls


def test_a_claim_that_meets_a_database_blip_waits_it_out_and_runs_the_body_once(
    claims: tuple[Celery, list[str]], monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    app, ran = claims
    app.tasks["lost.claim"].apply_async(task_id="blip-1")
    calls = claim_unreachable(monkeypatch, clock, 2, OperationalError)  # 20 s of a 30 s lease
    assert execute_next(app, QUEUE) == ("SUCCESS", "done")
    assert (len(calls), ran) == (3, ["blip-1"])
    assert Run.objects.get(task_id="blip-1").status == "SUCCEEDED"


def test_a_claim_that_cannot_reach_the_database_for_a_lease_hands_the_message_back_untold(
    claims: tuple[Celery, list[str]], monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    """Seed 6161 of the nemesis soak: the claim's error was stored as the task's FAILURE
    while the run was still QUEUED, and the caller in ``get()`` was told a failure of a
    run that later succeeded."""
    app, ran = claims
    app.tasks["lost.claim"].apply_async(task_id="outage-1")
    calls = claim_unreachable(monkeypatch, clock, 99, InterfaceError)
    state, wrapped = execute_next(app, QUEUE)
    raised = wrapped.exc  # as the pool hands it to the worker (ExceptionWithTraceback)
    assert (state, type(raised), raised.requeue) == ("REJECTED", Reject, True)
    assert "unreachable for 30.0 s" in str(raised)
    assert len(calls) == 3  # 0, 10, 20 s: tried again; at 30 s a whole lease has passed
    assert ran == []
    assert app.AsyncResult("outage-1").state == "PENDING"  # the caller is told nothing
    assert Run.objects.get(task_id="outage-1").status == "QUEUED"


def test_an_early_acked_message_whose_claim_cannot_reach_the_database_fails_with_why(
    claims: tuple[Celery, list[str]], monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    app, ran = claims
    app.conf.task_acks_late = False
    task = app.tasks["lost.claim"]
    monkeypatch.setattr(task, "acks_late", False)
    task.apply_async(task_id="outage-2")
    claim_unreachable(monkeypatch, clock, 99, OperationalError)
    state, raised = execute_next(app, QUEUE)  # the message is gone: the error is stored
    assert (state, type(raised), ran) == ("FAILURE", LedgerUnreachable, [])
    assert isinstance(app.AsyncResult("outage-2").result, LedgerUnreachable)


def test_a_claim_whose_statement_is_wrong_is_not_tried_again(
    claims: tuple[Celery, list[str]], monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    app, _ran = claims
    app.tasks["lost.claim"].apply_async(task_id="wrong-1")
    calls = claim_unreachable(monkeypatch, clock, 99, ProgrammingError)
    state, raised = execute_next(app, QUEUE)
    assert (state, type(raised), len(calls)) == ("FAILURE", ProgrammingError, 1)


def test_a_body_that_retries_while_the_database_restarts_is_retried_not_failed(
    claims: tuple[Celery, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    app, _ran = claims

    @app.task(base=DeadlineTask, bind=True, name="lost.retry", budget=600, shared=False)
    def again(self: DeadlineTask) -> str:
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        return "retried"

    again.apply_async(task_id="retry-1")
    cut_retry_once(monkeypatch, Runs, lambda: None)  # on the class: the worker's store
    assert execute_next(app, QUEUE)[0] == "RETRY"
    assert Run.objects.get(task_id="retry-1").status == "RETRYING"
    assert execute_next(app, QUEUE) == ("SUCCESS", "retried")
    assert Run.objects.get(task_id="retry-1").status == "SUCCEEDED"


# -- the end: committed in the ledger, never stored for the caller --------------------------


def test_a_success_whose_worker_died_before_storing_it_is_told_its_value_on_redelivery(
    claims: tuple[Celery, list[str]],
) -> None:
    """The soaks' ``result_unstored_after_success``: a run's completion committed
    SUCCEEDED, its worker died before Celery stored the result, and the caller stayed
    ``PENDING``. The completion kept the return value; the redelivery tells it."""
    app, _ran = claims

    @app.task(base=DeadlineTask, bind=True, name="lost.succeeds", budget=600, shared=False)
    def succeeds(self: DeadlineTask) -> dict[str, Any]:
        return {"receipt": "r-42", "amount": 1250}

    succeeds.apply_async(task_id="unstored-ok")
    [message] = drain(app, QUEUE)
    assert execute(app, message)[0] == "SUCCESS"
    run = Run.objects.get(task_id="unstored-ok")
    assert (run.status, run.result_content_type) == ("SUCCEEDED", "application/json")
    app.backend.forget("unstored-ok")  # what the dead worker never stored
    assert execute(app, message)[0] == "IGNORED"
    told = app.AsyncResult("unstored-ok")
    assert (told.state, told.result) == ("SUCCESS", {"receipt": "r-42", "amount": 1250})


def test_a_kept_return_value_written_over_the_bound_is_not_told_to_the_caller(
    claims: tuple[Celery, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    """A run's row holding a return value over the 64 KiB the completion keeps (an
    older version's, or written by hand) is read as none kept: the caller is not
    handed it, and the worker says why."""
    from celery_deadlines.ledger.results import RESULT_LIMIT

    app, _ran = claims

    @app.task(base=DeadlineTask, bind=True, name="lost.succeeds", budget=600, shared=False)
    def succeeds(self: DeadlineTask) -> str:
        return "small"

    succeeds.apply_async(task_id="unstored-big")
    [message] = drain(app, QUEUE)
    assert execute(app, message)[0] == "SUCCESS"
    whole = b'"' + b"x" * RESULT_LIMIT + b'"'  # JSON, one more byte than the bound each side
    Run.objects.filter(task_id="unstored-big").update(result=whole)
    app.backend.forget("unstored-big")
    with caplog.at_level("WARNING", logger="celery_deadlines"):
        assert execute(app, message)[0] == "IGNORED"
    assert app.AsyncResult("unstored-big").state == "PENDING"
    assert f"a return value of {RESULT_LIMIT + 2} bytes, over the {RESULT_LIMIT}" in caplog.text


def test_an_ignore_result_task_keeps_no_return_value_in_the_ledger(
    claims: tuple[Celery, list[str]],
) -> None:
    app, _ran = claims

    options: dict[str, Any] = {"budget": 600, "shared": False, "ignore_result": True}

    @app.task(base=DeadlineTask, bind=True, name="lost.quiet", **options)
    def quiet(self: DeadlineTask) -> str:
        return "not kept"

    quiet.apply_async(task_id="quiet-1")
    assert execute_next(app, QUEUE)[0] == "SUCCESS"
    run = Run.objects.get(task_id="quiet-1")
    assert (run.status, run.result) == ("SUCCEEDED", None)


@pytest.mark.parametrize("committed", [False, True], ids=["cut-before", "answer-lost"])
def test_a_child_whose_outbox_row_meets_a_cut_is_recorded_and_the_parent_succeeds(
    claims: tuple[Celery, list[str]], monkeypatch: pytest.MonkeyPatch, committed: bool
) -> None:
    """The soak's orders: ``notify.apply_async`` in the body met a 1 s database cut at
    its outbox row and the paid order ended ``FAILED error``. The row rides it out; a
    row whose answer was lost is found, and its message is the sweeper's to publish."""
    from celery_deadlines.ledger.sql.outbox import Outbox

    app, _ran = claims

    @app.task(base=DeadlineTask, bind=True, name="lost.parent", budget=600, shared=False)
    def parent(self: DeadlineTask) -> str:
        app.tasks["lost.claim"].apply_async(task_id="child-1")
        return "notified"

    real = Outbox.enqueue
    cut: list[str] = []

    def enqueue(self: Outbox, run: Any) -> bool:
        if run.task_id == "child-1" and not cut:  # the child's row, the first time
            cut.append(run.task_id)
            if committed:
                real(self, run)
            raise OperationalError("consuming input failed: server closed the connection")
        return bool(real(self, run))

    parent.apply_async(task_id="parent-1")
    monkeypatch.setattr(Outbox, "enqueue", enqueue)
    assert execute_next(app, QUEUE) == ("SUCCESS", "notified")
    assert cut == ["child-1"]
    child = Run.objects.get(task_id="child-1")
    assert (child.status, Run.objects.get(task_id="parent-1").status) == ("QUEUED", "SUCCEEDED")
    sent = [message["headers"]["id"] for message in drain(app, QUEUE)]
    # published at once after a cut before the database; after a lost answer the row
    # stands unpublished, and the sweeper publishes it (deadlines_republish_after)
    assert sent == ([] if committed else ["child-1"])


def test_a_failed_order_that_was_paid_says_so_in_its_record_error_and_explanation(
    claims: tuple[Celery, list[str]],
) -> None:
    app, _ran = claims

    @app.task(base=DeadlineTask, bind=True, name="lost.paid", budget=600, shared=False)
    def paid(self: DeadlineTask) -> None:
        with self.effect("charge", key="order-9:charge"):
            pass  # the provider took the payment
        raise ValueError("the mail provider is down")

    paid.apply_async(task_id="paid-1")
    state, raised = execute_next(app, QUEUE)
    note = "celery-deadlines: effects performed before this error: charge (order-9:charge)"
    assert (state, raised.__notes__) == ("FAILURE", [note])
    assert note in str(app.AsyncResult("paid-1").traceback)
    run = Run.objects.get(task_id="paid-1")
    assert (run.status, run.detail) == (
        "FAILED",
        f"ValueError('the mail provider is down'); {note}",
    )
    told = render_text(facts(run, events=list(run.events.all()), database_now=run.updated_at))
    assert any(note in line for line in told), told


def test_a_failed_run_whose_worker_died_before_storing_the_error_is_told_on_redelivery(
    claims: tuple[Celery, list[str]],
) -> None:
    """Seed 8181 of the nemesis soak: a run ended ``FAILED error``, its worker was killed
    35 ms later, before Celery stored the error, and the caller stayed ``PENDING``. Its
    late-acked message comes back; the claim finds the run ended and tells the caller."""
    app, _ran = claims

    @app.task(base=DeadlineTask, bind=True, name="lost.fails", budget=600, shared=False)
    def fails(self: DeadlineTask) -> None:
        raise ValueError("the notice's record met a cut")

    fails.apply_async(task_id="unstored-1")
    [message] = drain(app, QUEUE)
    assert execute(app, message)[0] == "FAILURE"
    app.backend.forget("unstored-1")  # what the dead worker never stored
    assert execute(app, message)[0] == "IGNORED"
    told = app.AsyncResult("unstored-1")
    assert told.state == "FAILURE"
    assert isinstance(told.result, RunFailed)
    assert (told.result.reason, told.result.detail) == (
        "error",
        'ValueError("the notice\'s record met a cut")',
    )
    run = Run.objects.get(task_id="unstored-1")
    assert (run.status, run.reason) == ("FAILED", "error")
    claims_made = RunEvent.objects.filter(run=run, kind="claim").values_list("outcome", flat=True)
    assert sorted(claims_made) == ["applied", "rejected"]
