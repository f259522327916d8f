"""An effect's name, key and parameters are checked before anything is recorded."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from celery_deadlines import InvalidEffect
from celery_deadlines.core.effects import MAX_KEY, MAX_NAME, checked, fingerprint_of


@pytest.mark.parametrize(
    ("name", "key", "complaint"),
    [
        ("pay", "", "key must be a non-empty string"),
        ("pay", 42, "got 42"),
        ("pay", None, "got None"),
        ("pay", "k" * (MAX_KEY + 1), f"at most {MAX_KEY} characters"),
        ("", "order-1", "effect name must be a non-empty string"),
        (7, "order-1", "got 7"),
        ("p" * (MAX_NAME + 1), "order-1", f"at most {MAX_NAME} characters"),
    ],
)
def test_a_bad_effect_name_or_key_is_refused_naming_it(
    name: object, key: object, complaint: str
) -> None:
    with pytest.raises(InvalidEffect, match=complaint):
        checked(name, key, {"amount": 1})


def test_parameters_that_cannot_be_serialised_are_refused_naming_the_effect() -> None:
    with pytest.raises(InvalidEffect, match=r"effect 'pay' \(key 'order-1'\).*object"):
        checked("pay", "order-1", {"client": object()})


def test_common_values_have_a_stable_fingerprint_across_processes() -> None:
    values: dict[str, Any] = {
        "at": datetime(2026, 11, 30, 12, tzinfo=UTC),
        "amount": Decimal("12.50"),
        "id": uuid.UUID(int=7),
    }
    assert fingerprint_of(values) == fingerprint_of(dict(reversed(values.items())))
    assert fingerprint_of(values) != fingerprint_of({**values, "amount": Decimal("12.51")})


def test_a_good_effect_is_returned_with_its_fingerprint() -> None:
    assert checked("pay", "order-1", None) == ("pay", "order-1", fingerprint_of(None))
