"""Two reconcilers and a new attempt, interleaved as in the soak's duplicated effect.

The soak once found a payment made twice: a reconciler that had read an effect as
unresolved settled it NOT_DISPATCHED *after* another reconciler had settled it, released
the run, and a new attempt had dispatched it again and called the provider. The stale
settlement overwrote the new dispatch, the new attempt's outcome was refused, and a
third attempt paid again.

Here the interleaving is forced, not hoped for, with real workers and crash points that
hold one thread until the test releases it (``wait:<file>``):

1. the first attempt dies after the dispatch guard, before the call (the effect is left
   DISPATCHED with no outcome);
2. the first reconciler to get the provider's answer (not found) is held before it
   writes it;
3. the other worker's reconciler settles the effect (not found), releases the run, and a
   new attempt dispatches it and calls the provider; it is held before recording the
   provider's reply;
4. the held reconciler is released: its settlement must do nothing, since the effect it
   was asked about has moved on (a newer dispatch), and say so;
5. the held attempt is released: its outcome is recorded, the run succeeds, one call.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from celery_deadlines.ledger._crashpoints import PLAN_FILE_ENV
from celery_deadlines.models import Run, RunEvent
from tests.integration.conftest import LEDGER_DB, ended, provider_calls
from tests.support.processes import Transport, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("postgres"),
    pytest.mark.django_db(transaction=True, databases=[LEDGER_DB]),
]


def fired_points(plan: Path) -> list[str]:
    log = Path(f"{plan}.fired.jsonl")
    if not log.exists():
        return []
    return [json.loads(line)["point"] for line in log.read_text().splitlines() if line]


def test_a_reconciler_that_read_an_effect_before_a_newer_dispatch_does_not_settle_it(
    tmp_path: Path,
    redis_broker: Transport,
    ledger_client: Any,
    ledger_worker: Any,
    provider: tuple[str, Path],
) -> None:
    url, provider_log = provider
    task_id = f"interleave-{uuid.uuid4().hex[:8]}"
    key = f"pay-{task_id}"
    plan = tmp_path / "crashplan.json"
    reconciler_go, attempt_go = tmp_path / "reconciler-go", tmp_path / "attempt-go"
    plan.write_text(
        json.dumps(
            {
                task_id: [
                    {"point": "effect.dispatched", "action": "kill"},
                    {"point": "reconcile.answered", "action": f"wait:{reconciler_go}"},
                    {"point": "effect.before_outcome", "action": f"wait:{attempt_go}"},
                ]
            }
        )
    )
    knobs = {
        PLAN_FILE_ENV: str(plan), "TEST_SINK_URL": url, "TEST_ACKS_LATE": "1",
        "TEST_REJECT_ON_WORKER_LOST": "1", "TEST_VISIBILITY_TIMEOUT": "5",
        "TEST_LEASE_TTL": "2", "TEST_MAX_LOST_LEASES": "5",
    }  # fmt: skip
    tasks = ledger_client(redis_broker)
    ledger_worker.together(2, redis_broker, concurrency=2, **knobs)
    tasks.sweep_pay.apply_async((key,), task_id=task_id, budget=90)

    # steps 1-3: one reconciler is held with its answer, the other settled the effect and
    # a new attempt called the provider, and is held before recording the reply
    wait_for(lambda: len(provider_calls(provider_log, key)) == 1, 60)
    wait_for(lambda: "effect.before_outcome" in fired_points(plan), 30)
    assert fired_points(plan) == ["effect.dispatched", "reconcile.answered",
                                  "effect.before_outcome"]  # fmt: skip
    effect = Run.objects.using(LEDGER_DB).get(task_id=task_id).effects.get()
    assert (effect.state, effect.dispatches) == ("DISPATCHED", 2)

    # step 4: the held reconciler writes what it was told about the first dispatch
    reconciler_go.touch()

    def written() -> list[tuple[str, str, str]]:
        events = RunEvent.objects.using(LEDGER_DB).filter(run__task_id=task_id)
        settled = [
            (e.kind, e.outcome, e.detail) for e in events
            if (e.kind, e.outcome) in {("effect_settle", "rejected"),
                                       ("effect_not_dispatched", "applied")}
        ]  # fmt: skip
        return settled if len(settled) >= 2 else []

    # the first settlement (applied), then the held one's: refused, not applied again
    first, second = wait_for(written, 30)
    assert first[:2] == ("effect_not_dispatched", "applied")
    assert second[:2] == ("effect_settle", "rejected"), second
    assert "dispatch 1" in second[2], second[2]
    assert "dispatch 2" in second[2], second[2]
    effect.refresh_from_db()
    assert (effect.state, effect.dispatches) == ("DISPATCHED", 2)  # left as it is

    # step 5: the new attempt records the provider's reply; nothing is paid twice
    attempt_go.touch()
    run = wait_for(lambda: ended(task_id), 60)
    assert (run.status, run.reason) == ("SUCCEEDED", "")
    calls = provider_calls(provider_log, key)
    assert len(calls) == 1, calls
    effect.refresh_from_db()
    assert (effect.state, effect.dispatches) == ("SUCCEEDED", 2)
