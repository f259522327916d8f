"""The reliability checker must be able to fail: each invariant is shown to catch its bug."""

from __future__ import annotations

from typing import Any

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
