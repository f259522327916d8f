"""Observations and the freshness each action class needs (seed 003), as pure rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from celery_deadlines.errors import InvalidDeadline
from celery_deadlines.rules.observations import ActionClass, Observation, earliest_expiry, stale

T0 = datetime(2026, 3, 12, 11, 0, tzinfo=UTC)


def seen(source: str = "order_state", ttl: float = 30, token: int = 2) -> Observation:
    """An observation made at T0 by the attempt holding ``token``."""
    expires = T0 + timedelta(seconds=ttl)
    return Observation(source, {"status": "editable"}, T0, expires, f"ev-{source}", token)


def test_fresh_evidence_of_this_attempt_may_support_any_action() -> None:
    for action in ActionClass:
        assert stale([seen()], action, now=T0 + timedelta(seconds=10), token=2) == []


def test_expired_evidence_may_inform_but_not_recommend_reserve_or_commit() -> None:
    later = T0 + timedelta(seconds=31)
    assert stale([seen()], ActionClass.INFORM, now=later, token=2) == []
    for action in (ActionClass.RECOMMEND, ActionClass.RESERVE, ActionClass.COMMIT):
        [problem] = stale([seen()], action, now=later, token=2)
        assert problem.startswith("order_state: expired at 2026-03-12T11:00:30+00:00")


def test_a_reservation_re_reads_evidence_an_earlier_attempt_observed() -> None:
    carried = seen(token=1)  # restored from a checkpoint of attempt 1
    assert stale([carried], ActionClass.RECOMMEND, now=T0, token=2) == []
    [problem] = stale([carried], ActionClass.RESERVE, now=T0, token=2)
    assert "observed by an earlier attempt (token 1)" in problem


def test_a_commit_needs_every_source_the_contract_says_to_revalidate() -> None:
    required = ["order_state", "customer_confirmation"]
    [problem] = stale([seen()], ActionClass.COMMIT, now=T0, token=2, required=required)
    assert problem == "customer_confirmation: not observed"
    both = [seen(), seen("customer_confirmation", ttl=300)]
    assert stale(both, ActionClass.COMMIT, now=T0, token=2, required=required) == []


def test_resuming_never_refreshes_an_observations_timestamps() -> None:
    # seed 003's second anti-pattern: a resumed plan that re-stamps its evidence hides
    # its age; the envelope comes back from a checkpoint exactly as it was made
    original = seen()
    restored = Observation.from_json(original.to_json())
    assert restored == original
    assert stale([restored], ActionClass.RECOMMEND, now=T0 + timedelta(minutes=6), token=2)


def test_the_guard_checks_the_earliest_expiry_except_for_information() -> None:
    evidence = [seen(ttl=300), seen("customer_confirmation", ttl=30)]
    assert earliest_expiry(evidence, ActionClass.COMMIT) == T0 + timedelta(seconds=30)
    assert earliest_expiry(evidence, ActionClass.INFORM) is None
    assert earliest_expiry([], ActionClass.COMMIT) is None


def test_an_observation_needs_aware_instants_that_make_sense() -> None:
    with pytest.raises(InvalidDeadline, match="timezone-aware"):
        Observation("s", 1, datetime(2026, 1, 1), datetime(2026, 1, 2, tzinfo=UTC), "ev")
    with pytest.raises(ValueError, match="expires before it was observed"):
        Observation("s", 1, T0, T0, "ev")
