"""A green pool's worker keeps as many ledger connections as it runs jobs at once, not
one per job it ever ran: each job runs in a greenlet of its own, and a connection of a
thread's (a greenlet's) is handed to the next job when its job ends."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections

from tests.integration.conftest import LEDGER_DB
from tests.support.processes import Transport

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("postgres"),
    pytest.mark.django_db(transaction=True, databases=[LEDGER_DB]),
]

CONCURRENCY = 5
#: the worker's own: its main process's reconciler and the heartbeat's
OWN = 3


def ledger_connections() -> int:
    """The sessions on the ledger's database, this test's own left out."""
    with connections[LEDGER_DB].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        (count,) = cursor.fetchone()
    return int(count)


@pytest.mark.parametrize("pool", ["gevent", "threads"])
def test_a_worker_keeps_a_connection_per_job_it_runs_at_once_not_per_job_it_ran(
    redis: Transport, ledger_client: Any, ledger_worker: Any, pool: str
) -> None:
    tasks = ledger_client(redis)
    ledger_worker(redis, concurrency=CONCURRENCY, pool=pool)
    counts = []
    for batch in range(3):
        results = [tasks.effect.apply_async((f"k-{batch}-{n}",), budget=60) for n in range(40)]
        assert [r.get(timeout=60)["key"] for r in results] == [f"k-{batch}-{n}" for n in range(40)]
        counts.append(ledger_connections())
    # before: a gevent worker opened one for each job, kept until its greenlet was
    # collected (91 after 400 jobs at concurrency 10)
    assert max(counts) <= CONCURRENCY + OWN, counts
