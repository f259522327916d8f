"""The fake is held to the real thing: one contract, run against
:class:`celery_deadlines.testing.FakeLedger` and the ledger on SQLite and PostgreSQL.

Each scenario asks what the Celery tier asks of a ledger (the ``LedgerAPI``) and what
an attempt writes through the result of its claim; tests/support/ledger_contract.py
says how each ledger is driven and how time passes for it. A behaviour the fake does
not play is skipped for it with the reason (:meth:`ContractLedger.requires`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_deadlines.errors import DispatchRefused, EffectConflict, RunConflict, StaleLease
from celery_deadlines.rules.records import ClaimRefused, NewRun, Recorded, Refusal
from celery_deadlines.rules.states import Status
from celery_deadlines.testing import FakeClock, use_clock
from tests.conftest import service_unavailable
from tests.django.conftest import DATABASES
from tests.support.ledger_contract import KEY, MESSAGE, TASK, TTL, ContractLedger, Database, Fake
from tests.support.processes import reachable

#: Past the lease and the supervisor's grace: another claim may take the run over.
LAPSED = TTL.total_seconds() + 2
MINUTE = timedelta(seconds=60)


class ProviderTimeout(Exception):
    pass


@pytest.fixture(params=[pytest.param("fake", id="fake"), *DATABASES])
def ledger(request: pytest.FixtureRequest) -> Iterator[ContractLedger]:
    """The ledger under the contract: the fake on a fake clock, or the database's."""
    app = Celery(f"contract-{uuid.uuid4().hex[:6]}", broker="memory://", backend="cache+memory://")
    app.conf.update(deadlines_max_lost_leases=1, task_default_queue="contract")
    if request.param == "fake":
        with use_clock(FakeClock()) as clock:
            yield Fake(app, clock)
        app.close()
        return
    from celery_deadlines.ledger import api

    if request.param == "postgres" and not reachable("127.0.0.1", 5432):
        service_unavailable("PostgreSQL 127.0.0.1:5432")
    app.conf.update(deadlines_ledger=True, deadlines_database=request.param)
    yield Database(app, str(request.param))
    for store in api._stores.values():  # the worker's own connections
        store.close()
    app.close()


def won(outcome: Any) -> Any:
    assert hasattr(outcome, "lease"), outcome
    return outcome


def refused(outcome: Any) -> ClaimRefused:
    assert isinstance(outcome, ClaimRefused), outcome
    return outcome


# -- claim won, claim lost -----------------------------------------------------------------


def test_a_recorded_run_is_claimed_by_one_worker_with_the_first_fencing_token(
    ledger: ContractLedger,
) -> None:
    assert ledger.record("r1") is Recorded.NOW
    attempt = won(ledger.claim("r1", "w1"))
    assert (attempt.lease.token, attempt.lease.attempt) == (1, 1)
    loss = refused(ledger.claim("r1", "w2"))
    assert (loss.why, loss.status, loss.token) == (ClaimRefused.HELD, "RUNNING", 1)
    assert loss.owner.startswith("w1:")
    seen = ledger.seen("r1")
    assert seen is not None
    assert (seen.status, seen.token) == ("RUNNING", 1)


def test_an_eager_run_is_sent_at_once_and_again_under_its_id_unless_its_arguments_differ(
    ledger: ContractLedger,
) -> None:
    # an eager run is recorded inside its eager_run, then sent by the caller (Celery's
    # apply(), whose claim decides): the same run again is no conflict
    run = NewRun(task_id="r1", task_name=TASK, message_body=MESSAGE)
    with ledger.api.eager_run(ledger.app):
        ledger.api.record_eager_run(ledger.app, run)
    assert ledger.status("r1") == "QUEUED"
    with ledger.api.eager_run(ledger.app):
        ledger.api.record_eager_run(ledger.app, run)
    assert ledger.status("r1") == "QUEUED"
    other = replace(run, message_body=b'{"args": [43], "kwargs": {}, "options": {}}')
    with pytest.raises(RunConflict, match="now with args"), ledger.api.eager_run(ledger.app):
        ledger.api.record_eager_run(ledger.app, other)


def test_a_message_for_another_task_neither_claims_nor_ends_the_run_its_own_task_claims(
    ledger: ContractLedger,
) -> None:
    ledger.record("r1")
    before = ledger.seen("r1")
    loss = refused(ledger.claim("r1", "w2", task="shop.refund"))
    assert (loss.why, loss.status, loss.token, loss.owner) == (
        ClaimRefused.TASK_MISMATCH,
        "QUEUED",
        0,
        "",
    )
    assert ledger.refuse("r1", task="shop.refund") == Refusal(Refusal.TASK_MISMATCH)
    assert ledger.seen("r1") == before
    assert won(ledger.claim("r1", "w1")).lease.token == 1


def test_a_message_older_than_its_run_is_refused_as_stale_and_the_current_one_claims(
    ledger: ContractLedger,
) -> None:
    ledger.record("r1", retries=2)
    assert refused(ledger.claim("r1", retries=1)).why == ClaimRefused.STALE_MESSAGE
    won(ledger.claim("r1", retries=2))


def test_a_claim_is_refused_when_the_deadline_leaves_less_than_the_reserve_or_has_passed(
    ledger: ContractLedger,
) -> None:
    ledger.record("r1", deadline_in=5)
    assert refused(ledger.claim("r1", reserve=10)).why == ClaimRefused.DEADLINE
    ledger.let_pass(6)
    assert refused(ledger.claim("r1", reserve=10)).why == ClaimRefused.DEADLINE_PASSED
    assert ledger.status("r1") == "QUEUED"


def test_the_lease_of_a_claim_never_outlives_the_runs_deadline(ledger: ContractLedger) -> None:
    ledger.record("r1", deadline_in=5)
    lease = won(ledger.claim("r1")).lease
    assert lease.expires_at == lease.deadline


# -- stale token -------------------------------------------------------------------------------


def test_a_write_with_a_token_another_claim_replaced_is_refused_and_changes_nothing(
    ledger: ContractLedger,
) -> None:
    ledger.record("r1")
    stale = won(ledger.claim("r1", "w1"))
    ledger.let_pass(LAPSED)
    won(ledger.claim("r1", "w2"))
    with pytest.raises(StaleLease) as checkpoint:
        stale.checkpoint("charged", {"step": 2})
    with pytest.raises(StaleLease) as success:
        stale.succeed()
    assert (checkpoint.value.write, success.value.write) == ("checkpoint", "succeed")
    assert (checkpoint.value.token, stale.lost) == (1, True)
    seen = ledger.seen("r1")
    assert seen is not None
    assert (seen.status, seen.token, seen.owner.split(":")[0]) == ("RUNNING", 2, "w2")


def test_an_attempt_whose_lease_lapsed_cannot_end_its_run_even_if_nobody_took_over(
    ledger: ContractLedger,
) -> None:
    ledger.record("r1")
    attempt = won(ledger.claim("r1"))
    ledger.let_pass(LAPSED)
    with pytest.raises(StaleLease) as refusal:
        attempt.end(Status.FAILED, "error", "late")
    assert refusal.value.write == "finish"
    assert ledger.status("r1") == "RUNNING"


# -- lease lapse -------------------------------------------------------------------------------


def test_a_lapsed_lease_lets_another_worker_claim_with_the_next_token_and_counts_it_lost(
    ledger: ContractLedger,
) -> None:
    ledger.record("r1")
    first = won(ledger.claim("r1", "w1"))
    first.checkpoint("reserved", {"sku": "A1"})
    ledger.let_pass(LAPSED)
    second = won(ledger.claim("r1", "w2"))
    assert (second.lease.token, second.lease.attempt) == (2, 2)
    assert second.last_checkpoint == ("reserved", {"sku": "A1"})
    seen = ledger.seen("r1")
    assert seen is not None
    assert seen.lost_leases == 1


def test_a_lease_lapsed_less_than_the_supervisors_grace_ago_is_still_held(
    ledger: ContractLedger,
) -> None:
    ledger.record("r1")
    won(ledger.claim("r1", "w1"))
    ledger.let_pass(TTL.total_seconds() + 0.5)
    assert refused(ledger.claim("r1", "w2")).why == ClaimRefused.HELD
    ledger.let_pass(1)
    won(ledger.claim("r1", "w2"))


def test_a_run_that_lost_as_many_leases_as_allowed_is_not_taken_over_again(
    ledger: ContractLedger,
) -> None:
    # deadlines_max_lost_leases = 1 (the fixture's app)
    ledger.record("r1")
    won(ledger.claim("r1", "w1"))
    ledger.let_pass(LAPSED)
    won(ledger.claim("r1", "w2"))
    ledger.let_pass(LAPSED)
    assert refused(ledger.claim("r1", "w3")).why == ClaimRefused.LOST_LEASES


# -- the effect guard -------------------------------------------------------------------------


def test_an_effect_is_dispatched_once_and_its_result_replayed_to_a_later_attempt(
    ledger: ContractLedger,
) -> None:
    ledger.record("r1")
    first = won(ledger.claim("r1", "w1"))
    with ledger.charge(first) as fx:
        assert (fx.completed, fx.fence) == (False, 1)
        fx.succeed({"charge": "ch_1"})
    ledger.let_pass(LAPSED)
    second = won(ledger.claim("r1", "w2"))
    with ledger.charge(second) as fx:
        assert (fx.completed, fx.result) == (True, {"charge": "ch_1"})
    assert ledger.effect_state() == ("SUCCEEDED", 1)


def test_the_same_effect_key_with_other_parameters_is_refused(ledger: ContractLedger) -> None:
    ledger.record("r1")
    attempt = won(ledger.claim("r1"))
    with ledger.charge(attempt, amount=100):
        pass
    with pytest.raises(EffectConflict, match="other parameters"), ledger.charge(attempt, 999):
        pytest.fail("the call must not be made")


def test_an_attempt_that_lost_its_lease_cannot_pass_the_dispatch_guard(
    ledger: ContractLedger,
) -> None:
    ledger.record("r1")
    stale = won(ledger.claim("r1", "w1"))
    ledger.let_pass(LAPSED)
    won(ledger.claim("r1", "w2"))
    with pytest.raises(DispatchRefused) as refusal, ledger.charge(stale):
        pytest.fail("the call must not be made")
    assert refusal.value.reason == "stale_lease"
    assert ledger.effect_state() == ("INTENT_RECORDED", 0)


def test_the_dispatch_guard_refuses_once_the_runs_deadline_has_passed(
    ledger: ContractLedger,
) -> None:
    ledger.record("r1", deadline_in=5)
    late = won(ledger.claim("r1"))
    ledger.let_pass(6)
    with pytest.raises(DispatchRefused) as refusal, ledger.charge(late):
        pytest.fail("the call must not be made")
    assert refusal.value.reason == "deadline_passed"


def test_a_request_that_certainly_never_left_is_dispatched_again_by_a_later_attempt(
    ledger: ContractLedger,
) -> None:
    ledger.record("r1")
    first = won(ledger.claim("r1", "w1"))
    with pytest.raises(ConnectionRefusedError), ledger.charge(first):
        raise ConnectionRefusedError("provider down")
    assert (ledger.effect_state(), first.unresolved) == (("NOT_DISPATCHED", 1), set())
    ledger.let_pass(LAPSED)
    second = won(ledger.claim("r1", "w2"))
    with ledger.charge(second) as fx:
        assert fx.fence == 2
    assert ledger.effect_state() == ("SUCCEEDED", 2)


def test_an_effect_of_unknown_outcome_blocks_every_new_dispatch_of_its_key(
    ledger: ContractLedger,
) -> None:
    ledger.record("r1")
    attempt = won(ledger.claim("r1"))
    with pytest.raises(ProviderTimeout), ledger.charge(attempt):
        raise ProviderTimeout("read timed out")
    assert (ledger.effect_state(), attempt.unresolved) == (("UNKNOWN", 1), {KEY})
    with pytest.raises(DispatchRefused) as refusal, ledger.charge(attempt):
        pytest.fail("the call must not be made")
    assert refusal.value.reason == "unresolved"


def test_a_run_whose_attempt_ends_with_an_effect_of_unknown_outcome_ends_unknown(
    ledger: ContractLedger,
) -> None:
    ledger.record("r1")
    attempt = won(ledger.claim("r1"))
    with pytest.raises(ProviderTimeout), ledger.charge(attempt):
        raise ProviderTimeout("read timed out")
    attempt.succeed()  # the attempt may not know of it: the ledger does
    seen = ledger.seen("r1")
    assert seen is not None
    assert (seen.status, seen.reason) == ("UNKNOWN", "effect_unresolved")
    assert ledger.ended("r1") is None
    assert refused(ledger.claim("r1", "w2")).why == ClaimRefused.UNRESOLVED


def test_nobody_claims_or_refuses_a_lapsed_run_before_its_dispatched_effect_is_reconciled(
    ledger: ContractLedger,
) -> None:
    ledger.record("r1")
    crashed = won(ledger.claim("r1", "w1"))
    ledger.charge(crashed).__enter__()  # dispatched; the process dies before the outcome
    ledger.let_pass(LAPSED)
    assert refused(ledger.claim("r1", "w2")).why == ClaimRefused.UNRESOLVED
    assert ledger.refuse("r1") == Refusal(Refusal.NOT_ENDED, "RUNNING", "")
    assert ledger.effect_state() == ("DISPATCHED", 1)
    assert ledger.status("r1") == "RUNNING"


def test_a_late_outcome_of_the_dispatching_attempt_is_recorded_and_frees_its_run(
    ledger: ContractLedger,
) -> None:
    ledger.record("r1")
    slow = won(ledger.claim("r1", "w1"))
    scope = ledger.charge(slow).__enter__()
    ledger.let_pass(LAPSED)
    scope.succeed("ch_1")  # fenced by the run and its token, not by the lapsed lease
    assert ledger.effect_state() == ("SUCCEEDED", 1)
    with ledger.charge(won(ledger.claim("r1", "w2"))) as fx:
        assert (fx.completed, fx.result) == (True, "ch_1")


# -- settle ------------------------------------------------------------------------------------


def test_an_attempts_end_is_read_back_with_its_status_reason_and_detail(
    ledger: ContractLedger,
) -> None:
    ledger.record("r1")
    attempt = won(ledger.claim("r1"))
    assert ledger.ended("r1") is None  # running: not ended
    attempt.end(Status.FAILED, "error", "ValueError('boom')")
    ended = ledger.ended("r1")
    assert (ended.task_name, ended.status, ended.reason, ended.detail) == (
        "shop.charge",
        "FAILED",
        "error",
        "ValueError('boom')",
    )


def test_a_run_that_ended_refuses_every_later_claim_and_refusal(ledger: ContractLedger) -> None:
    ledger.record("r1")
    won(ledger.claim("r1")).succeed()
    assert ledger.status("r1") == "SUCCEEDED"
    assert refused(ledger.claim("r1", "w2")).why == ClaimRefused.TERMINAL
    assert ledger.refuse("r1") == Refusal(Refusal.ALREADY_ENDED, "SUCCEEDED", "")
    assert ledger.ended("r1").status == "SUCCEEDED"


def test_a_retry_hands_the_run_to_the_next_retry_number_alone(ledger: ContractLedger) -> None:
    ledger.record("r1")
    attempt = won(ledger.claim("r1"))
    ledger.api.hand_to_retry(attempt, retries=1, available_at=None, message_body=b"{}")
    assert ledger.status("r1") == "RETRYING"
    assert refused(ledger.claim("r1", retries=0)).why == ClaimRefused.STALE_MESSAGE
    assert won(ledger.claim("r1", retries=1)).lease.token == 2


def test_a_gate_refusal_ends_a_waiting_run_but_not_one_a_live_lease_holds(
    ledger: ContractLedger,
) -> None:
    ledger.record("waiting")
    assert ledger.refuse("waiting") == Refusal(Refusal.ENDED)
    assert ledger.ended("waiting").reason == "deadline_passed"
    ledger.record("held")
    holder = won(ledger.claim("held"))
    assert ledger.refuse("held") == Refusal(Refusal.OWNED, "RUNNING", "", owner=holder.owner)
    assert ledger.status("held") == "RUNNING"
    assert ledger.refuse("held") == Refusal(Refusal.OWNED, "RUNNING", "", owner=holder.owner)


def test_a_deadline_refusal_ends_a_recorded_run_only_when_the_ledgers_clock_agrees(
    ledger: ContractLedger,
) -> None:
    ledger.record("in-time", deadline_in=600)
    not_confirmed = ledger.refuse("in-time", confirm_within=5)
    assert (not_confirmed.outcome, not_confirmed.status) == (Refusal.NOT_CONFIRMED, "QUEUED")
    assert not not_confirmed
    # what the ledger's clock says, for the worker whose clock ran ahead to be told
    assert not_confirmed.deadline is not None
    assert not_confirmed.database_now is not None
    left = (not_confirmed.deadline - not_confirmed.database_now).total_seconds()
    assert 590 < left <= 600
    assert ledger.status("in-time") == "QUEUED"
    ledger.record("due", deadline_in=3)
    assert ledger.refuse("due", confirm_within=5)
    assert ledger.status("due") == "EXPIRED"


def test_a_refused_message_without_a_run_gets_a_run_that_ended_so(
    ledger: ContractLedger,
) -> None:
    assert ledger.refuse("by-name", confirm_within=5)
    seen = ledger.seen("by-name")
    assert seen is not None
    assert (seen.status, seen.reason) == ("EXPIRED", "deadline_passed")


# -- retention ---------------------------------------------------------------------------------


def test_an_ended_run_is_purged_once_its_last_write_is_older_than_the_retention(
    ledger: ContractLedger,
) -> None:
    ledger.requires("retention")
    ledger.record("r1")
    won(ledger.claim("r1")).succeed()
    assert ledger.purge(MINUTE) == 0
    ledger.let_pass(61)
    assert ledger.purge(MINUTE) == 1
    assert ledger.seen("r1") is None


def test_a_run_waiting_for_its_effects_outcome_is_kept_however_old(
    ledger: ContractLedger,
) -> None:
    ledger.requires("retention")
    ledger.record("r1")
    attempt = won(ledger.claim("r1"))
    with pytest.raises(ProviderTimeout), ledger.charge(attempt):
        raise ProviderTimeout("read timed out")
    attempt.succeed()  # ends UNKNOWN
    ledger.let_pass(61)
    assert ledger.purge(MINUTE) == 0
    assert ledger.status("r1") == "UNKNOWN"


def test_an_ended_run_whose_effect_was_replayed_within_the_retention_is_kept(
    ledger: ContractLedger,
) -> None:
    ledger.requires("retention")
    ledger.record("r1")
    first = won(ledger.claim("r1"))
    with ledger.charge(first) as fx:
        fx.succeed("ch_1")
    first.succeed()
    ledger.let_pass(61)
    ledger.record("r1-again")
    with ledger.charge(won(ledger.claim("r1-again"))) as fx:
        assert fx.completed  # the key asked for now: its run stays
    assert ledger.purge(MINUTE) == 0
    assert ledger.status("r1") == "SUCCEEDED"
