"""A claim's records made without their constructors hold what the constructors would.

:meth:`Lease.claimed` and :meth:`ClaimRefused.lost` fill a frozen dataclass's fields
without its ``__init__`` (the ledger builds one at every claim); a field added to the
class and not to them would be missing from every claim's record.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields
from datetime import UTC, datetime, timedelta

import pytest

from celery_deadlines.rules.records import ClaimRefused, Lease

NOW = datetime(2026, 12, 4, 16, 0, 0, 123457, tzinfo=UTC)


def test_a_lease_made_for_a_won_claim_holds_what_its_constructor_would_in_every_field() -> None:
    values = (
        7,
        "run-7",
        3,
        11,
        2,
        NOW + timedelta(seconds=30),
        NOW + timedelta(minutes=5),
        "step-2",
        {"done": [1, 2]},
        NOW,
        NOW - timedelta(seconds=1),
        "w1@host:42",
    )
    made, built = Lease.claimed(*values), Lease(*values)
    assert made == built
    assert vars(made) == vars(built)
    assert [f.name for f in fields(Lease)] == list(vars(made))


def test_a_refusal_made_for_a_lost_claim_holds_what_its_constructor_would_in_every_field() -> None:
    values = ("held", "RUNNING", 4, "w2@host:43", NOW + timedelta(seconds=9), NOW)
    made, built = ClaimRefused.lost(*values), ClaimRefused(*values)
    assert made == built
    assert vars(made) == vars(built)
    assert [f.name for f in fields(ClaimRefused)] == list(vars(made))


def test_a_lease_made_for_a_won_claim_is_as_frozen_as_one_constructed() -> None:
    made = Lease.claimed(1, "run-1", 1, 1, 1, None, None, "", None, NOW, None, "w")
    with pytest.raises(FrozenInstanceError):
        made.token = 2  # type: ignore[misc]
    assert made.token == 1
