"""The project's own time limits on a real worker: a deadline only shortens them.

A worker's limits come from the app's settings (``task_time_limit``,
``task_soft_time_limit``: cookiecutter-django sets 300 and 60) or its command line
(``--time-limit``, ``--soft-time-limit``). Celery applies them to a job that has none of
its own; a DeadlineTask's job is given the least of them and the time its deadline
leaves, and its claim records what it was given, which ``explain`` shows whatever the
explaining process's settings (this one has none). Run on each Celery release the
package supports: ``make matrix-env`` builds an environment with the oldest (Celery
5.5, which copies no setting onto a task; 5.7 copies ``task_time_limit`` onto every task
that declares none).
"""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from celery_deadlines.models import Status
from tests.integration.conftest import LEDGER_DB, ended
from tests.integration.ledger.test_ledger import lines
from tests.support.processes import Transport, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("postgres"),
    pytest.mark.django_db(transaction=True, databases=[LEDGER_DB]),
]

#: The project's limits (hard, soft), far shorter than the deadline's budget.
HARD, SOFT = 2.0, 1.0
BUDGET = 30.0
#: Where the worker is given its limits: (worker arguments, environment of its app).
WHERE = {
    "settings": ((), {"TEST_TASK_TIME_LIMIT": str(HARD), "TEST_TASK_SOFT_TIME_LIMIT": str(SOFT)}),
    "command line": ((f"--time-limit={HARD}", f"--soft-time-limit={SOFT}"), {}),
}
#: Who set each limit, as the claim records it and explain says it.
SET_BY = {
    "settings": ("app", "the app's task_time_limit", "the app's task_soft_time_limit"),
    "command line": ("worker", "the worker's --time-limit", "the worker's --soft-time-limit"),
}


def explain(task_id: str, *flags: str) -> str:
    out = StringIO()
    call_command("deadlines", "--database", LEDGER_DB, "explain", task_id, *flags, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize("where", sorted(WHERE))
def test_the_projects_own_limits_stop_an_attempt_its_deadline_would_let_run_longer(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path, where: str
) -> None:
    """A body that catches the soft limit and goes on is stopped by the project's hard
    limit, as a plain task is, long before its deadline: the run FAILED ``time_limit``
    (the worker's own limit, not the deadline's cap, which would have ended it EXPIRED
    at the deadline), and the caller is told the hard limit that fired."""
    worker_args, env = WHERE[where]
    tasks = ledger_client(redis_broker)
    ledger_worker(redis_broker, worker_args=worker_args, **env)
    result = tasks.stubborn.apply_async(("stubborn", 2 * BUDGET), budget=BUDGET)
    run = wait_for(lambda: ended(result.id), 2 * BUDGET)
    assert (run.status, run.reason, run.detail) == (
        Status.FAILED,
        "time_limit",
        f"hard time limit ({HARD} s) exceeded",
    )
    with pytest.raises(Exception, match=rf"TimeLimitExceeded.*{HARD}"):
        result.get(timeout=10)
    # the soft limit came first: the body caught it and went on, and no effect followed
    assert [line["kind"] for line in lines(sink, key="stubborn")] == ["start", "soft"]

    # explain says what the attempt was given, as its claim recorded it
    source, hard_said, soft_said = SET_BY[where]
    [attempt] = json.loads(explain(result.id, "--json"))["time_limits"]
    assert attempt["recorded"]
    assert (attempt["hard_seconds"], attempt["hard_set_by"]) == (HARD, source)
    assert (attempt["soft_seconds"], attempt["soft_set_by"]) == (SOFT, source)
    said = explain(result.id)
    assert f"hard limit {HARD:.3f} s, {hard_said}; soft limit {SOFT:.3f} s, {soft_said}" in said


def test_explain_shows_the_limits_each_attempt_of_a_run_the_soft_limit_stopped_was_given(
    redis_broker: Transport, ledger_client: Any, ledger_worker: Any, sink: Path
) -> None:
    """Two attempts, each stopped by the app's soft limit (the first retries, the second
    fails with it): explain names, for each, the limits its claim recorded, where this
    process, whose app sets none, would have worked out none. The retry is admitted:
    the app's hard limit (Celery 5.7 copies it onto the task) is no attempt timeout."""
    tasks = ledger_client(redis_broker)
    _, env = WHERE["settings"]
    ledger_worker(redis_broker, **env)
    result = tasks.soft_stopped.apply_async(("soft", 2 * BUDGET), budget=BUDGET)
    run = wait_for(lambda: ended(result.id), 2 * BUDGET)
    assert (run.status, run.reason) == (Status.FAILED, "error")
    with pytest.raises(Exception, match="SoftTimeLimitExceeded"):
        result.get(timeout=10)
    assert [line["kind"] for line in lines(sink, key="soft")] == ["start", "soft"] * 2

    attempts = json.loads(explain(result.id, "--json"))["time_limits"]
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert [a["token"] for a in attempts] == [1, 2]
    for attempt in attempts:
        assert attempt["recorded"]
        assert (attempt["hard_seconds"], attempt["hard_set_by"]) == (HARD, "app")
        assert (attempt["soft_seconds"], attempt["soft_set_by"]) == (SOFT, "app")
    said = explain(result.id)
    given = (
        f"hard limit {HARD:.3f} s, the app's task_time_limit; "
        f"soft limit {SOFT:.3f} s, the app's task_soft_time_limit"
    )
    assert f"{given} (attempt 2 of 2, claimed {attempts[1]['at']})" in said
    assert "time limits, each attempt's, as its claim recorded them (2):" in said
