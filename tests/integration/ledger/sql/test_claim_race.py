"""Seed 000 fixture 5 at the database level: racing claims, exactly one winner.

Eight processes (each with its own PostgreSQL connection) are released together by a
barrier, 500 rounds, each round on a fresh run row in one of three states:

* ``fresh``:  queued, never claimed: exactly one racer wins, with token 1;
* ``lapsed``: claimed by an old holder whose lease has lapsed: exactly one racer takes
  it over with token 2, and the old holder's next write is refused;
* ``held``:   claimed by a holder whose lease is still valid: nobody wins.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import defaultdict
from datetime import timedelta

import pytest
from django.db import connections

from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.ledger.sql.rows import Lease, NewRun
from celery_deadlines.models import Run, RunEvent, Status
from tests.conftest import service_unavailable
from tests.support.processes import reachable
from tests.support.race import racer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True, databases=["postgres"]),
]

RACERS = 8
ROUNDS = 500
VARIANTS = ("fresh", "lapsed", "held")


def variant(round_: int) -> str:
    return VARIANTS[round_ % len(VARIANTS)]


def test_exactly_one_of_eight_racing_claims_wins_in_each_of_500_rounds() -> None:
    if not reachable("127.0.0.1", 5432):
        service_unavailable("PostgreSQL 127.0.0.1:5432")
    store = Store("postgres")
    old_holders: dict[int, Lease] = {}
    for round_ in range(ROUNDS):
        task_id = f"race-{round_}"
        store.outbox.enqueue(
            NewRun(
                task_id=task_id,
                task_name="race",
                root_id=task_id,
                message_body=None,
                content_type="",
                content_encoding="",
            )
        )
        if variant(round_) != "fresh":
            lease = store.runs.claim(
                task_id,
                0,
                task_name="race",
                owner="old",
                ttl=timedelta(hours=1),  # still held after the race, however slow it runs
                reserve=timedelta(0),
                max_lost_leases=1000,
            )
            assert isinstance(lease, Lease)
            old_holders[round_] = lease
    with connections["postgres"].cursor() as cursor:  # the lapsed rounds' leases run out
        cursor.execute(
            "UPDATE celery_deadlines_run SET lease_expires_at = clock_timestamp() "
            "- interval '1 second', op = 'age', op_detail = 'test: lease lapsed' "
            "WHERE task_id = ANY(%s)",
            [[f"race-{r}" for r in old_holders if variant(r) == "lapsed"]],
        )
    database = connections["postgres"].settings_dict["NAME"]
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(RACERS)
    results = context.Queue()
    processes = [
        context.Process(target=racer, args=(i, database, ROUNDS, barrier, results))
        for i in range(RACERS)
    ]
    started = time.monotonic()
    for process in processes:
        process.start()
    outcomes = [outcome for _ in processes for outcome in results.get(timeout=300)]
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    elapsed = time.monotonic() - started
    print(f"{ROUNDS * RACERS} racing claims in {elapsed:.1f} s")

    by_round: dict[int, list[tuple[int | None, str]]] = defaultdict(list)
    for round_, _, token, why in outcomes:
        by_round[round_].append((token, why))
    assert len(by_round) == ROUNDS
    for round_, claims in by_round.items():
        winners = [token for token, why in claims if why == "won"]
        losers = {why for _, why in claims if why != "won"}
        expected = {"fresh": [1], "lapsed": [2], "held": []}[variant(round_)]
        assert winners == expected, (round_, variant(round_), claims)
        assert losers == {"held"}, (round_, claims)

    for round_, lease in old_holders.items():
        refused = not store.runs.finish(lease, "old", Status.SUCCEEDED)
        assert refused == (variant(round_) == "lapsed"), round_
    assert RunEvent.objects.using("postgres").filter(
        kind="claim", outcome="rejected", owner__startswith="racer-"
    ).count() == ROUNDS * RACERS - len([r for r in range(ROUNDS) if variant(r) != "held"])
    tokens = Run.objects.using("postgres").values_list("lease_token", flat=True)
    assert max(tokens) <= 2
