"""The reliability checker must be able to fail: each invariant is shown to catch its bug."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.oracle import Ledgered, Planned, Verdict, check

ALLOWED = frozenset({("SUCCEEDED", "")})
RUN = Planned("run-1", "key-1", "effect.dispatched")
DONE = Ledgered("SUCCEEDED", "", True, "SUCCEEDED", 3)
FIRED = [{"task_id": "run-1", "point": "effect.dispatched"}]


def call(key: str = "key-1", token: int = 3, outcome: str = "accepted") -> dict[str, Any]:
    return {"key": key, "token": token, "outcome": outcome}


def judge(
    ledger: dict[str, Ledgered] | None = None,
    calls: list[dict[str, Any]] | None = None,
    fired: list[dict[str, Any]] | None = None,
    planned: list[Planned] | None = None,
) -> dict[str, list[str]]:
    verdict: Verdict = check(
        planned if planned is not None else [RUN],
        ledger if ledger is not None else {"run-1": DONE},
        calls if calls is not None else [call()],
        fired if fired is not None else FIRED,
        ALLOWED,
    )
    return verdict.violations()


def test_a_clean_history_has_no_violation() -> None:
    assert judge() == {}


def test_a_refused_provider_call_is_not_counted_as_an_effect() -> None:
    assert judge(calls=[call(token=1, outcome="refused"), call()]) == {}


def test_a_second_call_for_a_key_is_a_duplicate() -> None:
    assert set(judge(calls=[call(token=1), call()])) == {"duplicated", "mismatched"}


def test_an_acknowledged_run_the_ledger_never_saw_is_lost() -> None:
    assert "lost" in judge(ledger={}, calls=[])


def test_an_unacknowledged_run_without_a_row_is_not_lost() -> None:
    planned = [Planned("run-1", "key-1", None, acknowledged=False)]
    assert judge(planned=planned, ledger={}, calls=[]) == {}


def test_a_run_left_unknown_is_stuck() -> None:
    assert judge(ledger={"run-1": Ledgered("UNKNOWN", "effect_unresolved", False)}) == {
        "stuck": ["run-1"]
    }


def test_an_end_the_scenario_does_not_allow_is_unexplained() -> None:
    failed = Ledgered("FAILED", "error", True, "UNKNOWN", 3)
    assert set(judge(ledger={"run-1": failed})) == {"unexplained", "mismatched"}


def test_success_without_exactly_one_call_or_under_another_token_is_a_mismatch() -> None:
    assert "mismatched" in judge(calls=[])
    assert "mismatched" in judge(calls=[call(token=1)])


def test_a_call_for_a_key_nobody_planned_is_unexpected() -> None:
    assert judge(calls=[call(), call(key="other")]) == {"unexpected": ["other"]}


def test_a_planned_crash_that_never_fired_is_reported() -> None:
    assert judge(fired=[]) == {"unfired": ["run-1@effect.dispatched"]}


# -- the nemesis soak's invariants (tests/chaos) ------------------------------------------

DEADLINE = 1000.0
CLAIMED = Ledgered("SUCCEEDED", "", True, "SUCCEEDED", 3, DEADLINE, ((1, 900.0), (3, 950.0)))


def timed(token: int, at: float) -> dict[str, Any]:
    return {**call(token=token), "t": at}


def soak_judge(
    ledger: dict[str, Ledgered], calls: list[dict[str, Any]], callers: dict[str, str]
) -> dict[str, list[str]]:
    planned = [Planned("run-1", "key-1")]
    return check(planned, ledger, calls, [], ALLOWED, callers=callers).violations()


def test_a_call_under_the_current_token_before_the_deadline_is_clean() -> None:
    assert soak_judge({"run-1": CLAIMED}, [timed(3, 960.0)], {"run-1": "SUCCESS"}) == {}


def test_a_call_past_the_deadlines_cap_overran() -> None:
    found = soak_judge({"run-1": CLAIMED}, [timed(3, DEADLINE + 2)], {"run-1": "SUCCESS"})
    assert list(found) == ["overran"]


def test_a_call_under_a_token_already_superseded_is_a_stale_write_accepted() -> None:
    record = Ledgered("SUCCEEDED", "", True, "SUCCEEDED", 1, DEADLINE, ((1, 900.0), (3, 950.0)))
    found = soak_judge({"run-1": record}, [timed(1, 951.0)], {"run-1": "SUCCESS"})
    assert list(found) == ["stale_accepted"]
    # before the successor's claim it was still the holder's call
    assert soak_judge({"run-1": record}, [timed(1, 940.0)], {"run-1": "SUCCESS"}) == {}


def test_a_caller_told_otherwise_than_the_ledger_disagrees() -> None:
    for told in ("PENDING", "FAILURE", "UNKNOWN"):
        found = soak_judge({"run-1": CLAIMED}, [timed(3, 960.0)], {"run-1": told})
        assert list(found) == ["disagreeing"], told
    expired = Ledgered("EXPIRED", "deadline_passed", True)
    allowed = frozenset({("EXPIRED", "deadline_passed")})
    planned = [Planned("run-1", "key-1", allowed=allowed)]
    assert check(planned, {"run-1": expired}, [], [], ALLOWED, callers={"run-1": "FAILURE"}) == (
        Verdict()
    )


@pytest.mark.parametrize("ended", [("FAILED", "publish_failed"), ("EXPIRED", "queue_backlog")])
def test_a_run_whose_every_publish_raised_leaves_its_caller_pending(ended: tuple[str, str]) -> None:
    """``apply_async`` raised (the broker failed it, or the enqueue gate refused it for
    the queue ahead): nothing was sent or stored, and the caller that was told sees
    ``PENDING``; anything stored for it would be a disagreement."""
    unsent = Ledgered(*ended, True)
    planned = [Planned("run-1", "key-1", allowed=frozenset({ended}))]
    assert check(planned, {"run-1": unsent}, [], [], ALLOWED, callers={"run-1": "PENDING"}) == (
        Verdict()
    )
    told = check(planned, {"run-1": unsent}, [], [], ALLOWED, callers={"run-1": "FAILURE"})
    assert list(told.violations()) == ["disagreeing"]


def test_a_runs_own_allowed_ends_win_and_an_allowed_unknown_is_not_stuck() -> None:
    waiting = Ledgered("UNKNOWN", "no_reconciler", False)
    planned = [Planned("run-1", "key-1", allowed=frozenset({("UNKNOWN", "no_reconciler")}))]
    assert check(planned, {"run-1": waiting}, [], [], ALLOWED).violations() == {}
    assert (
        "stuck"
        in check([Planned("run-1", "key-1")], {"run-1": waiting}, [], [], ALLOWED).violations()
    )
