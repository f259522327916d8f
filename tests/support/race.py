"""A racing claimer for the DB-level claim race (spawned, so it owns its connection)."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any


def racer(index: int, database: str, rounds: int, barrier: Any, results: Any) -> None:
    """Claim ``race-<n>`` for every round, all racers released at once by ``barrier``."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()
    from django.db import connections

    from celery_deadlines.ledger.sql.connection import Store
    from celery_deadlines.ledger.sql.rows import ClaimRefused

    connections["postgres"].settings_dict["NAME"] = database
    store = Store("postgres")
    outcomes: list[tuple[int, int, int | None, str]] = []
    for round_ in range(rounds):
        barrier.wait()
        outcome = store.runs.claim(
            f"race-{round_}",
            0,
            task_name="race",
            owner=f"racer-{index}",
            ttl=timedelta(seconds=60),
            reserve=timedelta(0),
            max_lost_leases=1000,
        )
        if isinstance(outcome, ClaimRefused):
            outcomes.append((round_, index, None, outcome.why))
        else:
            outcomes.append((round_, index, outcome.token, "won"))
    results.put(outcomes)
    connections.close_all()
