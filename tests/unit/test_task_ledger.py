"""DeadlineTask's ledger paths on the in-memory ledger (``celery_deadlines.testing``).

Each message is executed by Celery's own tracer, as a pool process would, against a
:class:`FakeLedger` instead of a database: the outbox row before the publish, the claim
before the body, the outcome under the claim's token, the retry's hand-off, and every
way a delivery is not run. The same paths run against SQLite and PostgreSQL in
tests/django and across real processes in tests/integration.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_deadlines import (
    DeadlineRefused,
    DeadlineTask,
    InvalidEffect,
    Reason,
    ReservedHeader,
    RunConflict,
    RunFailed,
    StaleLease,
)
from celery_deadlines.core import claiming
from celery_deadlines.ledger import results
from celery_deadlines.ledger.outbox import UnreadableMessage
from celery_deadlines.testing import FakeClock, FakeLedger, use_ledger
from tests.support.memory_queue import drain
from tests.support.trace import execute, execute_next
from tests.support.unit_tasks import claim

QUEUE = "fake-ledger"


@pytest.fixture
def ledger() -> Iterator[FakeLedger]:
    with use_ledger(FakeLedger()) as fake:
        yield fake


@pytest.fixture
def app(ledger: FakeLedger, clock: FakeClock) -> Iterator[Celery]:
    app = Celery(f"fake-{uuid.uuid4().hex[:6]}", broker="memory://", backend="cache+memory://")
    app.conf.update(task_default_queue=QUEUE, deadlines_lease_ttl=30)
    drain(app, QUEUE)  # the in-memory transport is per process: start from an empty queue
    yield app
    app.close()


class Calls:
    def __init__(self) -> None:
        self.count = 0


def tasks(app: Celery, calls: Calls) -> dict[str, Any]:
    @app.task(base=DeadlineTask, bind=True, name="fake.work", budget=60, shared=False)
    def work(self: DeadlineTask, fail: str = "") -> int:
        calls.count += 1
        if fail == "error":
            raise ValueError("boom")
        if fail == "retry" and not self.request.retries:
            raise self.retry(countdown=1)
        return self.lease.token if self.lease else -1

    return {"work": work}


def test_a_run_is_recorded_before_its_message_and_succeeds_under_its_claim(
    app: Celery, ledger: FakeLedger
) -> None:
    calls = Calls()
    work = tasks(app, calls)["work"]
    work.apply_async(task_id="r1")
    assert ledger.run("r1").events == [("enqueue", "applied", "")]
    state, token = execute_next(app, QUEUE)
    run = ledger.run("r1")
    assert (state, token, calls.count) == ("SUCCESS", 1, 1)
    assert (run.status, run.token, run.attempt) == ("SUCCEEDED", 1, 1)
    assert [kind for kind, outcome, _ in run.events if outcome == "applied"] == [
        "enqueue",
        "claim",
        "succeeded",
    ]


def test_a_duplicate_delivery_of_a_finished_run_runs_nothing(
    app: Celery, ledger: FakeLedger
) -> None:
    calls = Calls()
    work = tasks(app, calls)["work"]
    work.apply_async(task_id="r2")
    [message] = drain(app, QUEUE)
    assert execute(app, message)[0] == "SUCCESS"
    state, _ = execute(app, message)  # redelivered
    assert (state, calls.count) == ("IGNORED", 1)
    assert ledger.run("r2").events[-1] == ("claim", "rejected", "terminal")


def test_a_redelivery_of_a_failed_run_tells_a_caller_left_waiting_what_the_ledger_recorded(
    app: Celery, ledger: FakeLedger
) -> None:
    # the worker that ended the run FAILED died before Celery stored the error: the
    # result backend has nothing, and the late-acked message comes back
    calls = Calls()
    work = tasks(app, calls)["work"]
    work.apply_async(task_id="r2f", kwargs={"fail": "error"})
    [message] = drain(app, QUEUE)
    assert execute(app, message)[0] == "FAILURE"
    app.backend.forget("r2f")
    assert app.AsyncResult("r2f").state == "PENDING"
    assert execute(app, message)[0] == "IGNORED"
    told = app.AsyncResult("r2f")
    assert (told.state, calls.count) == ("FAILURE", 1)
    assert isinstance(told.result, RunFailed)
    assert (told.result.reason, told.result.detail) == ("error", "ValueError('boom')")


def test_a_redelivery_of_an_expired_run_tells_a_caller_left_waiting_the_claim_gates_refusal(
    app: Celery, ledger: FakeLedger
) -> None:
    work = tasks(app, Calls())["work"]
    work.apply_async(task_id="r2e")
    [message] = drain(app, QUEUE)
    run = ledger.runs["r2e"]
    run.status, run.reason, run.detail = "EXPIRED", "deadline_passed", "lease lapsed"
    assert execute(app, message)[0] == "IGNORED"
    assert_told_the_claim_gates_refusal(app, "r2e")


def test_a_ledger_that_cannot_say_how_a_run_ended_never_fails_the_redelivery(
    app: Celery, ledger: FakeLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tasks(app, Calls())["work"]
    work.apply_async(task_id="r2x", kwargs={"fail": "error"})
    [message] = drain(app, QUEUE)
    assert execute(app, message)[0] == "FAILURE"
    app.backend.forget("r2x")

    def unreachable(*_: Any) -> None:
        raise ConnectionError("the ledger's database went away")

    monkeypatch.setattr(ledger, "ended_run", unreachable)
    assert execute(app, message)[0] == "IGNORED"
    assert app.AsyncResult("r2x").state == "PENDING"  # told nothing rather than a wrong thing


def test_a_redelivery_never_overwrites_an_outcome_the_caller_was_told(
    app: Celery, ledger: FakeLedger
) -> None:
    work = tasks(app, Calls())["work"]
    work.apply_async(task_id="r2k", kwargs={"fail": "error"})
    [message] = drain(app, QUEUE)
    assert execute(app, message)[0] == "FAILURE"
    assert execute(app, message)[0] == "IGNORED"
    assert isinstance(app.AsyncResult("r2k").result, ValueError)


class EndedMoments:
    """The run's end read back ``ago`` before the claim (the fake ledger keeps no such
    instant), and each pause of the refused delivery counted, the attempt that ended
    the run storing its own outcome at pause ``stored_at`` (if any)."""

    def __init__(
        self,
        app: Celery,
        ledger: FakeLedger,
        clock: FakeClock,
        monkeypatch: pytest.MonkeyPatch,
        *,
        ago: timedelta,
        stored_at: int | None = None,
    ) -> None:
        self.pauses = 0
        read_back = ledger.ended_run

        def ended_run(app_: Any, task_id: str) -> Any:
            return dataclasses.replace(read_back(app_, task_id), ended_at=clock.now() - ago)

        def pause(span: timedelta) -> None:
            assert span == claiming.OUTCOME_POLL
            self.pauses += 1
            if self.pauses == stored_at:
                app.backend.mark_as_failure("r2w", ValueError("the attempt's own"))

        monkeypatch.setattr(ledger, "ended_run", ended_run)
        monkeypatch.setattr(claiming, "_pause", pause)


def a_run_ended_failed_with_no_outcome_stored(app: Celery) -> Any:
    work = tasks(app, Calls())["work"]
    work.apply_async(task_id="r2w", kwargs={"fail": "error"})
    [message] = drain(app, QUEUE)
    assert execute(app, message)[0] == "FAILURE"
    app.backend.forget("r2w")  # as if the attempt had not stored its outcome yet
    return message


def test_a_duplicate_of_a_run_that_just_ended_leaves_the_caller_to_the_attempt_that_ended_it(
    app: Celery, ledger: FakeLedger, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the demo on a clean-clone CI: a duplicate delivery, refused 4 ms before the attempt
    # stored its PlanRefused, stored RunFailed first, and the caller read that
    message = a_run_ended_failed_with_no_outcome_stored(app)
    moments = EndedMoments(
        app, ledger, clock, monkeypatch, ago=timedelta(milliseconds=4), stored_at=3
    )
    assert execute(app, message)[0] == "IGNORED"
    assert moments.pauses == 3
    assert repr(app.AsyncResult("r2w").result) == repr(ValueError("the attempt's own"))


def test_a_run_whose_attempt_stores_nothing_within_the_grace_is_told_by_the_duplicate_after(
    app: Celery, ledger: FakeLedger, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = a_run_ended_failed_with_no_outcome_stored(app)
    moments = EndedMoments(app, ledger, clock, monkeypatch, ago=timedelta(milliseconds=500))
    assert execute(app, message)[0] == "IGNORED"
    # the rest of the grace (1.5 s), one look every 50 ms; no clock is read in between
    assert moments.pauses == (claiming.OUTCOME_GRACE - timedelta(milliseconds=500)) / (
        claiming.OUTCOME_POLL
    )
    assert isinstance(app.AsyncResult("r2w").result, RunFailed)


def test_a_clock_behind_the_end_never_makes_a_duplicate_wait_longer_than_the_grace(
    app: Celery, ledger: FakeLedger, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ``now`` is the local clock where the claim returned no database clock reading
    message = a_run_ended_failed_with_no_outcome_stored(app)
    moments = EndedMoments(app, ledger, clock, monkeypatch, ago=-timedelta(hours=1))
    assert execute(app, message)[0] == "IGNORED"
    assert moments.pauses == claiming.OUTCOME_GRACE / claiming.OUTCOME_POLL
    assert isinstance(app.AsyncResult("r2w").result, RunFailed)


def test_a_run_that_ended_longer_ago_than_the_grace_is_told_at_once(
    app: Celery, ledger: FakeLedger, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = a_run_ended_failed_with_no_outcome_stored(app)
    moments = EndedMoments(app, ledger, clock, monkeypatch, ago=claiming.OUTCOME_GRACE * 2)
    assert execute(app, message)[0] == "IGNORED"
    assert moments.pauses == 0
    assert isinstance(app.AsyncResult("r2w").result, RunFailed)


def test_a_redelivery_of_a_success_whose_result_was_lost_tells_the_kept_return_value(
    app: Celery, ledger: FakeLedger, caplog: pytest.LogCaptureFixture
) -> None:
    # the worker died after the ledger's SUCCEEDED, before Celery stored the result
    work = tasks(app, Calls())["work"]
    work.apply_async(task_id="r2s")
    [message] = drain(app, QUEUE)
    assert execute(app, message) == ("SUCCESS", 1)
    app.backend.forget("r2s")
    with caplog.at_level("WARNING", logger="celery_deadlines"):
        assert execute(app, message)[0] == "IGNORED"
    told = app.AsyncResult("r2s")
    assert (told.state, told.result) == ("SUCCESS", 1)
    assert "stored now: the return value the ledger kept" in caplog.text


def test_a_success_too_large_to_keep_is_left_to_the_result_backend_and_the_log_says_so(
    app: Celery, ledger: FakeLedger, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task(base=DeadlineTask, bind=True, name="fake.large", budget=60, shared=False)
    def large(self: DeadlineTask) -> str:
        return "x" * (results.RESULT_LIMIT + 1)

    large.apply_async(task_id="r2l")
    [message] = drain(app, QUEUE)
    assert execute(app, message)[0] == "SUCCESS"
    app.backend.forget("r2l")
    with caplog.at_level("WARNING", logger="celery_deadlines"):
        assert execute(app, message)[0] == "IGNORED"
    assert app.AsyncResult("r2l").state == "PENDING"
    assert "the ledger kept no return value" in caplog.text


def test_a_kept_return_value_is_decoded_only_with_the_result_serializer(
    app: Celery,
) -> None:
    kept = results.keep(app, {"paid": 1})
    assert kept is not None
    assert results.read(app, kept) == {"paid": 1}
    forged = dataclasses.replace(kept, content_type="application/x-python-serialize")
    with pytest.raises(UnreadableMessage, match="not decoded here"):
        results.read(app, forged)  # a row rewritten to pickle is never unpickled


def test_a_kept_return_value_over_the_bound_is_read_as_none_kept(
    app: Celery, ledger: FakeLedger, caplog: pytest.LogCaptureFixture
) -> None:
    # a row holding more than the completion keeps: written by hand, or by an older version
    work = tasks(app, Calls())["work"]
    work.apply_async(task_id="r2b")
    [message] = drain(app, QUEUE)
    assert execute(app, message) == ("SUCCESS", 1)
    app.backend.forget("r2b")
    kept = results.keep(app, "x" * (results.RESULT_LIMIT - 2))  # JSON's quotes: the limit
    assert kept is not None
    over = dataclasses.replace(kept, body=kept.body[:1] + b"x" + kept.body[1:])
    assert results.read(app, kept) == "x" * (results.RESULT_LIMIT - 2)
    with pytest.raises(UnreadableMessage, match="of 65537 bytes, over the 65536"):
        results.read(app, over)
    ledger.runs["r2b"].result = over
    with caplog.at_level("WARNING", logger="celery_deadlines"):
        assert execute(app, message)[0] == "IGNORED"
    assert app.AsyncResult("r2b").state == "PENDING"  # as for a value too large to keep
    assert "over the 65536 the ledger keeps, is read as none kept" in caplog.text


def test_a_delivery_while_another_worker_holds_a_live_lease_is_not_run(
    app: Celery, ledger: FakeLedger
) -> None:
    calls = Calls()
    work = tasks(app, calls)["work"]
    work.apply_async(task_id="r3")
    [message] = drain(app, QUEUE)
    ledger.runs["r3"].status, ledger.runs["r3"].token = "RUNNING", 7
    ledger.runs["r3"].lease_expires_at = ledger.runs["r3"].deadline  # alive
    assert execute(app, message, hostname="w2@test")[0] == "IGNORED"
    assert calls.count == 0
    assert ledger.run("r3").events[-1] == ("claim", "rejected", "held")


def test_a_claim_the_ledger_refuses_for_the_deadline_stores_the_refusal_for_the_caller(
    app: Celery, ledger: FakeLedger, clock: FakeClock
) -> None:
    calls = Calls()
    work = tasks(app, calls)["work"]
    work.apply_async(task_id="r4")
    # the header's deadline still leaves time, but the ledger's row says otherwise
    ledger.runs["r4"].deadline = clock.now()
    state, _raised = execute_next(app, QUEUE)
    assert (state, calls.count) == ("IGNORED", 0)
    refusal = app.AsyncResult("r4").result
    assert isinstance(refusal, DeadlineRefused)
    assert (refusal.gate, refusal.reason) == ("claim", "deadline_passed")
    assert ledger.run("r4").status == "EXPIRED"


def test_a_body_that_raises_ends_its_run_failed_with_the_error(
    app: Celery, ledger: FakeLedger
) -> None:
    work = tasks(app, Calls())["work"]
    work.apply_async(("error",), task_id="r5")
    state, raised = execute_next(app, QUEUE)
    run = ledger.run("r5")
    assert (state, repr(raised)) == ("FAILURE", "ValueError('boom')")
    assert (run.status, run.reason) == ("FAILED", "error")


def test_a_retry_hands_the_run_to_its_retry_message_which_claims_it_again(
    app: Celery, ledger: FakeLedger, clock: FakeClock
) -> None:
    calls = Calls()
    work = tasks(app, calls)["work"]
    work.apply_async(("retry",), task_id="r6")
    assert execute_next(app, QUEUE)[0] == "RETRY"
    run = ledger.run("r6")
    assert (run.status, run.retries) == ("RETRYING", 1)
    clock.advance(1)
    state, token = execute_next(app, QUEUE)
    assert (state, token, calls.count) == ("SUCCESS", 2, 2)
    assert ledger.run("r6").status == "SUCCEEDED"


def test_an_attempt_whose_lease_was_taken_over_stores_nothing_over_the_new_owner(
    app: Celery, ledger: FakeLedger
) -> None:
    seen: list[StaleLease] = []

    @app.task(base=DeadlineTask, bind=True, name="fake.slow", budget=60, shared=False)
    def slow(self: DeadlineTask) -> str:
        ledger.lapse("r7")  # paused past its lease...
        ledger.runs["r7"].token += 1  # ...while another worker claimed the run
        try:
            self.checkpoint("half", {})
        except StaleLease as exc:
            seen.append(exc)
            raise
        return "late"

    slow.apply_async(task_id="r7")
    state, _raised = execute_next(app, QUEUE)
    assert state == "IGNORED"
    assert seen
    assert seen[0].token == 1
    assert ledger.run("r7").events[-1] == ("checkpoint", "rejected", "stale token 1")
    assert app.AsyncResult("r7").state == "PENDING"  # no result over the new owner's


def test_a_message_sent_by_name_gets_its_run_when_it_is_claimed(
    app: Celery, ledger: FakeLedger
) -> None:
    tasks(app, Calls())
    app.send_task("fake.work", task_id="r8", budget=30)
    assert "r8" not in ledger.runs  # no outbox row: published by name
    assert execute_next(app, QUEUE)[0] == "SUCCESS"
    assert ledger.run("r8").status == "SUCCEEDED"
    assert ledger.run("r8").events[0] == ("enqueue", "applied", "")


def test_a_bad_effect_key_is_refused_before_anything_is_recorded(
    app: Celery, ledger: FakeLedger
) -> None:
    @app.task(base=DeadlineTask, bind=True, name="fake.pay", budget=60, shared=False)
    def pay(self: DeadlineTask, key: Any) -> None:
        with self.effect("pay", key=key):
            raise AssertionError("the call must not be made")

    pay.apply_async((42,), task_id="r9")
    state, raised = execute_next(app, QUEUE)
    assert state == "FAILURE"
    assert isinstance(raised, InvalidEffect)
    assert "effect 'pay': key must be a non-empty string" in str(raised)
    assert (ledger.run("r9").status, ledger.run("r9").reason) == ("FAILED", "error")


def test_a_task_id_published_again_with_the_same_arguments_is_the_same_run(
    app: Celery, ledger: FakeLedger
) -> None:
    work = tasks(app, Calls())["work"]
    first = work.apply_async(("",), task_id="r10")
    again = work.apply_async(("",), task_id="r10")
    assert again.id == first.id
    assert len(drain(app, QUEUE)) == 1  # nothing was published twice


def test_a_task_id_reused_with_other_arguments_or_another_task_is_refused(
    app: Celery, ledger: FakeLedger
) -> None:
    named = tasks(app, Calls())

    @app.task(base=DeadlineTask, bind=True, name="fake.other", budget=60, shared=False)
    def other(self: DeadlineTask) -> None:
        pass

    named["work"].apply_async(("",), task_id="r11")
    with pytest.raises(RunConflict, match=r"args \[''\].*now with args \['error'\]"):
        named["work"].apply_async(("error",), task_id="r11")
    with pytest.raises(RunConflict, match=r"first used for fake\.work, now for fake\.other"):
        other.apply_async(task_id="r11")
    assert len(drain(app, QUEUE)) == 1


def other_task(app: Celery, calls: Calls) -> Any:
    @app.task(base=DeadlineTask, bind=True, name="fake.other", budget=60, shared=False)
    def other(self: DeadlineTask) -> str:
        calls.count += 1
        return "other's result"

    return other


def test_a_message_for_another_task_carrying_a_runs_id_runs_nothing_and_the_run_runs_after(
    app: Celery, ledger: FakeLedger, refusals: list[Any]
) -> None:
    victim_calls, other_calls = Calls(), Calls()
    work = tasks(app, victim_calls)["work"]
    other_task(app, other_calls)
    work.apply_async(task_id="victim")
    app.send_task("fake.other", task_id="victim")  # by name: no DeadlineTask publish
    victim, forged = drain(app, QUEUE)
    assert forged["headers"]["task"] == "fake.other"
    state, _ = execute(app, forged)
    assert (state, other_calls.count, victim_calls.count) == ("IGNORED", 0, 0)
    run = ledger.run("victim")
    assert (run.status, run.token, run.attempt, run.owner) == ("QUEUED", 0, 0, "")
    assert run.events[-1] == ("claim", "rejected", "task_mismatch:fake.other")
    assert app.AsyncResult("victim").state == "PENDING"  # nothing stored under its id
    [refusal] = refusals
    assert (refusal.gate, refusal.reason) == ("claim", Reason.TASK_MISMATCH)
    assert execute(app, victim) == ("SUCCESS", 1)
    assert (victim_calls.count, other_calls.count) == (1, 0)
    assert ledger.run("victim").status == "SUCCEEDED"


def test_a_message_for_another_task_refused_by_its_own_header_leaves_the_run_as_it_was(
    app: Celery, ledger: FakeLedger
) -> None:
    # the same id with an unreadable deadline header: the claim gate refuses the message
    # by its header alone, and must not end the run it names, nor tell its caller
    other_calls = Calls()
    work = tasks(app, Calls())["work"]
    other = other_task(app, other_calls)
    work.apply_async(task_id="victim-2")
    headers = {"x_deadline": "not a deadline"}
    request, on_ack = claim(app, other, headers, task_id="victim-2")
    assert request.revoked()
    on_ack.assert_called_once()
    run = ledger.run("victim-2")
    assert (run.status, other_calls.count) == ("QUEUED", 0)
    assert run.events[-1] == ("refuse", "rejected", "task_mismatch:fake.other")
    assert app.AsyncResult("victim-2").state == "PENDING"


def test_a_message_for_another_task_tells_the_caller_of_the_ended_run_of_its_id_nothing(
    app: Celery, ledger: FakeLedger
) -> None:
    # the run failed and its worker died before telling its caller: a redelivery of the
    # run's own message tells it (test above); another task's message must not
    work = tasks(app, Calls())["work"]
    other = other_task(app, Calls())
    work.apply_async(task_id="victim-4")
    run = ledger.runs["victim-4"]
    run.status, run.reason, run.detail = "FAILED", "error", "ValueError('boom')"
    request, _ = claim(app, other, {"x_deadline": "not a deadline"}, task_id="victim-4")
    assert request.revoked()  # refused by the claim gate, for its header
    app.send_task("fake.other", task_id="victim-4")
    [forged] = [m for m in drain(app, QUEUE) if m["headers"]["task"] == "fake.other"]
    assert execute(app, forged)[0] == "IGNORED"  # refused by the claim: task_mismatch
    assert app.AsyncResult("victim-4").state == "PENDING"
    assert ledger.run("victim-4").status == "FAILED"


@pytest.mark.parametrize("header", ["id", "task"])
def test_a_header_that_would_set_the_messages_id_or_task_is_refused_and_nothing_is_recorded(
    app: Celery, ledger: FakeLedger, header: str
) -> None:
    work = tasks(app, Calls())["work"]
    work.apply_async(task_id="victim-3")
    with pytest.raises(ReservedHeader, match=rf"sets {header}, .*nothing was published"):
        work.apply_async(task_id="r-new", headers={header: "victim-3", "tenant": "acme"})
    assert sorted(ledger.runs) == ["victim-3"]
    assert len(drain(app, QUEUE)) == 1  # the victim's own message alone


def test_a_message_refused_at_the_claim_gate_tells_a_caller_left_waiting_how_the_run_ended(
    app: Celery, ledger: FakeLedger, clock: FakeClock
) -> None:
    # the reconciler expired the run and its DeadlineRefused was lost (a Redis restart
    # 0.6 s later, the nemesis soak, seed 1212); the late message comes back past its
    # deadline, and the worker's claim gate refuses it: the caller is told now
    work = tasks(app, Calls())["work"]
    work.apply_async(task_id="r2g", budget=5)
    [message] = drain(app, QUEUE)
    run = ledger.runs["r2g"]
    run.status, run.reason, run.detail = "EXPIRED", "deadline_passed", "lease lapsed"
    clock.advance(10)
    headers = {k: v for k, v in message["headers"].items() if k not in ("task", "id")}
    request, on_ack = claim(app, work, headers, task_id="r2g")
    assert app.AsyncResult("r2g").state == "PENDING"
    assert request.revoked()
    on_ack.assert_called_once()
    assert_told_the_claim_gates_refusal(app, "r2g")


def assert_told_the_claim_gates_refusal(app: Celery, task_id: str) -> None:
    """The caller of ``task_id`` holds the ledger's expiry as the claim gate's refusal."""
    refusal = app.AsyncResult(task_id).result
    assert isinstance(refusal, DeadlineRefused)
    assert (refusal.gate, refusal.reason, refusal.detail) == (
        "claim",
        "deadline_passed",
        "lease lapsed",
    )


def test_a_run_that_fails_after_its_effect_was_performed_names_it_in_its_record_and_error(
    app: Celery, ledger: FakeLedger
) -> None:
    @app.task(base=DeadlineTask, bind=True, name="fake.order", budget=60, shared=False)
    def order(self: DeadlineTask, key: str) -> None:
        with self.effect("charge", key=f"{key}:charge"):
            pass  # the provider took the payment
        raise ValueError("the confirmation mail bounced")

    order.apply_async(("o-7",), task_id="r-paid")
    state, raised = execute_next(app, QUEUE)
    note = "celery-deadlines: effects performed before this error: charge (o-7:charge)"
    assert (state, type(raised)) == ("FAILURE", ValueError)
    assert note in getattr(raised, "__notes__", [])
    run = ledger.run("r-paid")
    assert (run.status, run.reason) == ("FAILED", "error")
    assert run.detail == f"ValueError('the confirmation mail bounced'); {note}"
    assert note in str(app.AsyncResult("r-paid").traceback)  # what any caller reads


def test_a_run_that_fails_before_any_effect_adds_nothing_to_its_error(
    app: Celery, ledger: FakeLedger
) -> None:
    work = tasks(app, Calls())["work"]
    work.apply_async(("error",), task_id="r-unpaid")
    state, raised = execute_next(app, QUEUE)
    assert (state, getattr(raised, "__notes__", None)) == ("FAILURE", None)
    assert ledger.run("r-unpaid").detail == "ValueError('boom')"


def test_an_effect_an_earlier_attempt_performed_is_named_when_a_later_one_fails(
    app: Celery, ledger: FakeLedger
) -> None:
    @app.task(base=DeadlineTask, bind=True, name="fake.reorder", budget=60, shared=False)
    def reorder(self: DeadlineTask, key: str) -> None:
        with self.effect("charge", key=f"{key}:charge"):
            pass  # performed by attempt 1, replayed by attempt 2
        if not self.request.retries:
            raise self.retry(countdown=0)
        raise ValueError("the stock was gone")

    reorder.apply_async(("o-8",), task_id="r-replayed")
    assert execute_next(app, QUEUE)[0] == "RETRY"
    state, raised = execute_next(app, QUEUE)
    assert (state, type(raised)) == ("FAILURE", ValueError)
    assert getattr(raised, "__notes__", []) == [
        "celery-deadlines: effects performed before this error: charge (o-8:charge)"
    ]
    assert ledger.effects["o-8:charge"].dispatches == 1  # replayed, never called again
