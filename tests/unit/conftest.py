"""Fixtures of the Celery tier's unit tests: an app on the memory broker and the
refusals it reported (a test module may define its own ``app``; ``published``, what it
published, is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_deadlines import deadline_refused
from celery_deadlines.rules.gates import Decision


@pytest.fixture(autouse=True)
def _forget_revoked_ids() -> Iterator[None]:
    """Celery's worker state remembers the ids it revoked (an expired message's among
    them) for the whole process: a later test's message with the same id would be
    revoked by it."""
    from celery.worker import state

    yield
    state.revoked.clear()


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("unit", broker="memory://", backend="cache+memory://", set_as_current=True)
    app.conf.task_always_eager = False
    app.conf.deadlines_ledger = False  # the header tier; the ledger has its own tests
    yield app
    app.close()


@pytest.fixture
def refusals() -> Iterator[list[Decision]]:
    seen: list[Decision] = []

    def record(decision: Decision, **_: Any) -> None:
        seen.append(decision)

    deadline_refused.connect(record, weak=False)
    yield seen
    deadline_refused.disconnect(record)
