"""Shared fixtures: a fake clock, a clean environment, and "skip locally, fail in CI"."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from celery_deadlines.testing import FakeClock, use_clock

for _name in list(os.environ):
    if _name.startswith("CELERY_DEADLINES_") and _name != "CELERY_DEADLINES_SOAK":
        del os.environ[_name]


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    """A fake clock installed for the whole process (unit tests never sleep)."""
    with use_clock(FakeClock()) as fake:
        yield fake


def service_unavailable(what: str) -> None:
    """Skip when a service is missing on a laptop; fail when ``CI=true``."""
    message = f"{what} is not reachable"
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"{message} (CI=true: services are required)", pytrace=False)
    pytest.skip(message)
