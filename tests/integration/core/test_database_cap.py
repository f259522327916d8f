"""The deadline reaches the database, on a real worker: a body's queries end by it.

Workers of ``tests.support.databaseapp`` (the ledger's app and its PostgreSQL, kept open
between tasks, with a SQLite alias ``local``) run a query far longer than the budget,
an update that waits on a row this test holds locked, and short queries; each task
reports the time it had left (its own ``self.remaining()``) when it began and when
its query came back. A query is cut by the deadline, not after it: at most a tenth of
the time left early (the headroom that spares the next statements a setting of their
own: :mod:`celery_deadlines.rules.database`), never late. The connection the next task
gets reads the server's defaults whatever the first ended with.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import call_command

from celery_deadlines import QueryCut
from celery_deadlines.models import Effect, Run, RunEvent, Status
from celery_deadlines.rules.database import HEADROOM_FRACTION
from tests.integration.conftest import LEDGER_DB, ended, ledger_database_url
from tests.support.processes import Transport, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("postgres"),
    pytest.mark.django_db(transaction=True, databases=[LEDGER_DB]),
]

BUDGET = 3.0
#: How long a result may take to come back: the budget, and a worker's start.
WAIT = 30.0


@pytest.fixture
def workers(ledger_worker: Any, tmp_path: Path) -> Any:
    ledger_worker.app_module = "tests.support.databaseapp"

    def start(
        transport: Transport, pool: str = "prefork", *, pooled: bool = False, **env: str
    ) -> Any:
        if pooled:  # Django's pool: each task gives its connection back when it ends
            settings, reuse = {"DJANGO_SETTINGS_MODULE": "tests.support.database_pool_settings"}, {}
        else:  # one connection kept open between tasks (CELERY_DB_REUSE_MAX)
            settings = {"DJANGO_SETTINGS_MODULE": "tests.support.database_settings"}
            reuse = {"TEST_DB_REUSE_MAX": "100"}
        return ledger_worker(
            transport,
            pool=pool,
            TEST_SQLITE_PATH=str(tmp_path / "local.sqlite3"),
            **settings,
            **reuse,
            **env,
        )

    return start


@pytest.fixture
def tasks(ledger_client: Any, redis_broker: Transport) -> Any:
    ledger_client(redis_broker)
    from tests.support import databaseapp

    return databaseapp


def came_back_by_the_deadline(seen: dict[str, Any]) -> None:
    """The query came back to the body before the deadline (the body's own reading),
    and no earlier than the cap's headroom allows."""
    assert seen["cut"] is not None, seen
    assert 0 <= seen["left_after"] <= seen["left_at_start"] * HEADROOM_FRACTION + 0.002, seen


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo", "gevent", "eventlet"])
def test_a_query_longer_than_the_budget_comes_back_to_the_body_cut_by_the_deadline(
    redis_broker: Transport, tasks: Any, workers: Any, pool: str
) -> None:
    """Under eventlet psycopg blocks every green thread while the query runs, the
    lease's renewals too: with the test app's lease of 2 s the lease lapses before the
    cut (docs/explanation/pools.md); with the default lease, longer than the budget,
    the lease ends at the deadline and the cut body's result is stored."""
    env = {"TEST_LEASE_TTL": "30"} if pool == "eventlet" else {}
    workers(redis_broker, pool, **env)
    seen = tasks.slow.apply_async(budget=BUDGET).get(timeout=WAIT)
    came_back_by_the_deadline(seen)
    assert "the query 'SELECT pg_sleep(10)' on database 'default'" in seen["cut"], seen
    assert seen["cause"] == "OperationalError", seen


@pytest.fixture
def held_row() -> Iterator[int]:
    """Row 1 of ``cd_cap_probe``, locked by this test's open transaction."""
    url = ledger_database_url()
    with psycopg.connect(url, autocommit=True) as setup:
        setup.execute("CREATE TABLE IF NOT EXISTS cd_cap_probe (id int PRIMARY KEY, n int)")
        setup.execute("INSERT INTO cd_cap_probe VALUES (1, 0) ON CONFLICT DO NOTHING")
    with psycopg.connect(url) as holder:
        holder.execute("SELECT n FROM cd_cap_probe WHERE id = 1 FOR UPDATE")
        yield 1
        holder.rollback()


def test_a_lock_wait_ends_by_the_deadline(
    redis_broker: Transport, tasks: Any, workers: Any, held_row: int
) -> None:
    workers(redis_broker)
    seen = tasks.locked.apply_async((held_row,), budget=BUDGET).get(timeout=WAIT)
    came_back_by_the_deadline(seen)
    assert "UPDATE cd_cap_probe" in seen["cut"], seen


def server_defaults() -> dict[str, str]:
    with psycopg.connect(ledger_database_url(), autocommit=True) as fresh:
        statement = fresh.execute("SHOW statement_timeout").fetchone()
        lock = fresh.execute("SHOW lock_timeout").fetchone()
    assert statement is not None
    assert lock is not None
    return {"statement_timeout": statement[0], "lock_timeout": lock[0]}


@pytest.mark.parametrize(
    ("pool", "pooled"), [("prefork", False), ("threads", False), ("threads", True), ("solo", True)]
)
def test_the_next_task_on_the_same_connection_reads_the_servers_defaults_however_the_first_ended(
    redis_broker: Transport, tasks: Any, workers: Any, pool: str, pooled: bool
) -> None:
    """A success, a cut query and the body's own error, each followed on the same
    backend (one pool process or thread; a connection kept open, or given back to
    Django's pool of one connection and borrowed again) by a task without a deadline
    that reads the timeouts."""
    workers(redis_broker, pool, pooled=pooled)
    defaults = server_defaults()
    firsts: dict[str, tuple[Any, tuple[Any, ...], float]] = {
        "success": (tasks.quick, (3,), 30),
        "cut": (tasks.slow, (), BUDGET),
        "error": (tasks.quick, (3, True), 30),
    }
    backends = set()
    for ending, (task, args, budget) in firsts.items():
        outcome = task.apply_async(args, budget=budget).get(timeout=WAIT, propagate=False)
        assert (ending == "error") == isinstance(outcome, ValueError), (ending, outcome)
        if ending == "cut":
            assert outcome["cut"] is not None, outcome
        after = tasks.settings.delay().get(timeout=WAIT)
        backends.add(after["backend"])
        read = {key: after[key] for key in defaults}
        assert read == defaults, (ending, after)
    assert len(backends) == 1, backends  # one connection, kept open throughout


def test_a_sqlite_query_is_interrupted_by_the_deadline(
    redis_broker: Transport, tasks: Any, workers: Any
) -> None:
    workers(redis_broker)
    seen = tasks.slow.apply_async(("local",), budget=BUDGET).get(timeout=WAIT)
    came_back_by_the_deadline(seen)
    assert "(interrupted)" in seen["cut"], seen
    assert "the query 'WITH RECURSIVE" in seen["cut"], seen
    assert "on database 'local'" in seen["cut"], seen


def explain(task_id: str) -> str:
    out = StringIO()
    call_command("deadlines", "--database", LEDGER_DB, "explain", task_id, stdout=out)
    return out.getvalue()


def test_an_uncaught_cut_ends_the_run_expired_deadline_passed_and_explain_names_the_query(
    redis_broker: Transport, tasks: Any, workers: Any
) -> None:
    workers(redis_broker)
    result = tasks.slow.apply_async(("default", False), budget=BUDGET)
    with pytest.raises(QueryCut) as cut:
        result.get(timeout=WAIT)
    assert (cut.value.gate, cut.value.reason) == ("database", "deadline_passed")
    run = wait_for(lambda: ended(result.id), WAIT)
    assert (run.status, run.reason) == (Status.EXPIRED, "deadline_passed")
    assert "pg_sleep(10)" in run.detail, run.detail
    assert "the query 'SELECT pg_sleep(10)' on database 'default' was cut" in explain(result.id)


def test_a_write_cut_inside_an_effect_leaves_it_unknown_and_the_run_waits_for_its_reconciler(
    redis_broker: Transport, tasks: Any, workers: Any, held_row: int
) -> None:
    """A cut is an error like any other inside ``self.effect``: the write may have been
    part of a call that happened, so the effect is UNKNOWN and the run waits for the
    reconciler (docs/howto/effects.md)."""
    workers(redis_broker)
    key = f"cut-{uuid.uuid4().hex[:8]}"
    result = tasks.effect_write.apply_async((key, held_row), budget=BUDGET)

    def unknown() -> Run | None:  # not terminal: it waits
        return Run.objects.using(LEDGER_DB).filter(task_id=result.id, status="UNKNOWN").first()

    run = wait_for(unknown, WAIT)
    assert (run.status, run.reason) == (Status.UNKNOWN, "effect_unresolved"), run.detail
    assert "QueryCut" in run.detail, run.detail
    effect = Effect.objects.using(LEDGER_DB).get(key=key)
    assert effect.state == "UNKNOWN"
    assert effect.error.startswith("QueryCut("), effect.error
    assert "UPDATE cd_cap_probe" in effect.error, effect.error
    assert run.deadline is not None
    assert effect.updated_at <= run.deadline  # recorded before the deadline, not after


def test_a_write_cut_inside_an_effect_that_declares_it_not_sent_is_not_dispatched(
    redis_broker: Transport, tasks: Any, workers: Any, held_row: int
) -> None:
    """Declared in ``not_sent`` (the effect's writes are one transaction the cut rolls
    back), the effect is NOT_DISPATCHED, safe to try again, and the run ends as any
    uncaught cut does: EXPIRED deadline_passed."""
    workers(redis_broker)
    key = f"cut-{uuid.uuid4().hex[:8]}"
    result = tasks.effect_write.apply_async((key, held_row, True), budget=BUDGET)
    with pytest.raises(QueryCut):
        result.get(timeout=WAIT)
    run = wait_for(lambda: ended(result.id), WAIT)
    assert (run.status, run.reason) == (Status.EXPIRED, "deadline_passed"), run.detail
    effect = Effect.objects.using(LEDGER_DB).get(key=key)
    assert effect.state == "NOT_DISPATCHED"
    assert effect.error.startswith("QueryCut("), effect.error


def test_a_pooled_connection_the_body_gives_back_itself_is_never_lent_with_its_timeouts(
    redis_broker: Transport, tasks: Any, workers: Any
) -> None:
    """The body closes its connection after a statement the cap set the session's
    timeouts for: Django's pool takes it back as it is. The next borrower (a task
    without a deadline, on the threads pool where Django's pool outlives a task) reads
    the server's defaults: the connection given back was closed, not lent again."""
    workers(redis_broker, "threads", pooled=True)
    defaults = server_defaults()
    first = tasks.gives_back.apply_async(budget=30).get(timeout=WAIT)
    after = tasks.settings.delay().get(timeout=WAIT)
    assert {key: after[key] for key in defaults} == defaults, after
    assert after["backend"] != first["backend"]


def test_under_eventlet_a_query_longer_than_the_lease_lapses_it_and_the_bodys_end_is_refused(
    redis_broker: Transport, tasks: Any, workers: Any
) -> None:
    """What the pools page says of eventlet: while psycopg blocks the worker no renewal
    runs, so a query longer than the lease (the test app's 2 s; the query is cut a tenth
    of a 6 s budget before its deadline) lapses it: the attempt's end is refused, and
    the run is taken over (or, past its deadline, expired) like any lapsed one."""
    workers(redis_broker, "eventlet")
    result = tasks.slow.apply_async(budget=2 * BUDGET)
    result.get(timeout=WAIT, propagate=False)
    run = wait_for(lambda: ended(result.id), WAIT)
    events = list(RunEvent.objects.using(LEDGER_DB).filter(run=run))
    refused = [e for e in events if e.outcome == "rejected" and e.lease_token == 1]
    assert refused, [(str(e), e.reason, e.detail) for e in events]
    assert run.lease_token > 1 or run.status == Status.EXPIRED, (str(run), events)


def test_a_body_the_hard_time_limit_ends_leaves_its_pooled_connection_with_the_defaults(
    redis_broker: Transport, tasks: Any, workers: Any
) -> None:
    """gevent stops the body at the deadline's hard limit where it waits (prefork's
    kills the process, and its connections with it): the cap's reset still runs before
    the connection goes back to Django's pool, and the next borrower reads the defaults."""
    workers(redis_broker, "gevent", pooled=True)
    defaults = server_defaults()
    first = tasks.settings.delay().get(timeout=WAIT)
    outcome = tasks.stuck.apply_async(budget=BUDGET).get(timeout=WAIT, propagate=False)
    assert type(outcome).__name__ == "TimeLimitExceeded", outcome
    after = tasks.settings.delay().get(timeout=WAIT)
    assert after["backend"] == first["backend"]  # the pool's one connection, lent again
    assert {key: after[key] for key in defaults} == defaults, after
