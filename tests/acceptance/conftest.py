"""The stories end to end: the integration fixtures (real brokers, PostgreSQL, worker
processes) and the Django ones (the ledger on SQLite and PostgreSQL), shared here."""

from __future__ import annotations

from tests.django.conftest import alias
from tests.integration.conftest import (
    broker,
    ledger_client,
    ledger_worker,
    postgres,
    provider,
    pytest_runtest_makereport,
    queue,
    redis,
    redis_broker,
    sink,
)

__all__ = [
    "alias",
    "broker",
    "ledger_client",
    "ledger_worker",
    "postgres",
    "provider",
    "pytest_runtest_makereport",
    "queue",
    "redis",
    "redis_broker",
    "sink",
]
