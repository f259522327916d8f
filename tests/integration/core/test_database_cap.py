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

from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import call_command

from celery_deadlines import QueryCut
from celery_deadlines.models import Status
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

    def start(transport: Transport, pool: str = "prefork") -> Any:
        return ledger_worker(
            transport,
            pool=pool,
            DJANGO_SETTINGS_MODULE="tests.support.database_settings",
            TEST_SQLITE_PATH=str(tmp_path / "local.sqlite3"),
            TEST_DB_REUSE_MAX="100",
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


# eventlet is not here: psycopg blocks every green thread while a query runs (see
# docs/explanation/pools.md)
@pytest.mark.parametrize("pool", ["prefork", "threads", "solo", "gevent"])
def test_a_query_longer_than_the_budget_comes_back_to_the_body_cut_by_the_deadline(
    redis_broker: Transport, tasks: Any, workers: Any, pool: str
) -> None:
    workers(redis_broker, pool)
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


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_the_next_task_on_the_same_connection_reads_the_servers_defaults_however_the_first_ended(
    redis_broker: Transport, tasks: Any, workers: Any, pool: str
) -> None:
    """A success, a cut query and the body's own error, each followed on the same
    backend (one pool process or thread, ``CONN_MAX_AGE``) by a task without a
    deadline that reads the timeouts."""
    workers(redis_broker, pool)
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
