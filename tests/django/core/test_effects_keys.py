"""A bad effect name or key writes nothing to the ledger (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from celery_deadlines import InvalidEffect
from celery_deadlines.core.effects import EffectScope
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.models import Effect, RunEvent
from tests.django.core.test_effects import attempt, record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgres"])


@pytest.mark.parametrize("key", ["", 42, None, "k" * 256])
def test_a_bad_key_is_refused_before_an_intent_is_recorded(alias: str, key: object) -> None:
    store = Store(alias)
    record(store)
    current = attempt(store, "w1:1")
    events = RunEvent.objects.using(alias).count()
    with pytest.raises(InvalidEffect, match="key must be a non-empty string"):
        EffectScope(current, "pay", key, {"amount": 1})  # type: ignore[arg-type]
    assert not Effect.objects.using(alias).exists()
    assert RunEvent.objects.using(alias).count() == events
