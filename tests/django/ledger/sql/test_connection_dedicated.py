"""The workers' dedicated PostgreSQL connection: statements on psycopg's own cursor.

A worker's claim, fenced writes and completion run on a connection of the library's own
(``Store(dedicated=True)``), without Django's cursor wrapper. What the wrapper gave must
still hold: one round trip per transition (counted here by libpq's own trace of the
protocol, not by Django's query log, which that path does not feed), Django's exceptions
for a failed statement, a connection lost meanwhile replaced by the next statement, and
transactions that commit or roll back whole.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError, ProgrammingError, connections

from celery_deadlines.ledger.sql import connection as connection_module
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.rules.states import Status
from celery_deadlines.testing import FakeClock, use_clock
from tests.django.conftest import one_database
from tests.django.ledger.sql.test_ledger_store import claim, events, lost, new_run, won
from tests.support.processes import wait_for

pytestmark = pytest.mark.parametrize(
    "alias", [one_database("postgres", "postgresql")], indirect=True
)

TTL = timedelta(seconds=30)


@pytest.fixture
def dedicated(alias: str) -> Iterator[Store]:
    store = Store(alias, dedicated=True)
    yield store
    store.close()


class Trace:
    """libpq's trace of one connection: the messages the client sent, by type."""

    def __init__(self, store: Store) -> None:
        store.database_now()  # connected
        local = store._threads.local
        assert local is not None
        assert local.direct
        assert local.connection is not None
        self._pgconn = local.connection.connection.pgconn
        self._file = tempfile.NamedTemporaryFile("w+", suffix=".trace", delete=False)  # noqa: SIM115
        self.path = Path(self._file.name)

    def __enter__(self) -> Trace:
        from psycopg.pq import Trace as Flags

        self._pgconn.trace(self._file.fileno())
        self._pgconn.set_trace_flags(Flags.SUPPRESS_TIMESTAMPS)
        return self

    def __exit__(self, *_: object) -> None:
        self._pgconn.untrace()
        self._file.close()

    def round_trips(self) -> int:
        """Statements sent: each ends with the extended protocol's ``Sync``."""
        lines = self.path.read_text().splitlines()
        os.unlink(self.path)
        return sum(1 for line in lines if line.startswith("F") and "\tSync" in line)


def test_a_workers_claim_and_completion_are_one_round_trip_each(
    alias: str, dedicated: Store
) -> None:
    Store(alias).outbox.enqueue(new_run(deadline=datetime.now(UTC) + TTL))
    with Trace(dedicated) as claiming:
        lease = won(claim(dedicated))
    with Trace(dedicated) as completing:
        assert dedicated.runs.finish(lease, "w1:1", Status.SUCCEEDED)
    assert (claiming.round_trips(), completing.round_trips()) == (1, 1)
    # psycopg's own loader reads the instants (not Django's): still aware, in UTC
    assert {lease.expires_at.tzinfo, lease.database_now.tzinfo} == {UTC}  # type: ignore[union-attr]
    assert events(dedicated) == [
        ("enqueue", "applied"),
        ("claim", "applied"),
        ("succeeded", "applied"),
    ]


def test_a_workers_lost_claim_is_one_round_trip_with_its_event(
    alias: str, dedicated: Store
) -> None:
    Store(alias).outbox.enqueue(new_run())
    won(claim(Store(alias)))
    with Trace(dedicated) as refusing:
        loss = lost(claim(dedicated, owner="w2:1"))
    assert refusing.round_trips() == 1
    assert (loss.why, loss.status, loss.owner) == ("held", "RUNNING", "w1:1")
    assert events(dedicated)[-1] == ("claim", "rejected")


def synchronous_commit(store: Store) -> str:
    [(value,)] = store.execute("SHOW synchronous_commit", [])[1]
    return str(value)


def test_a_lost_claim_of_its_own_commits_without_waiting_for_the_disk_a_won_one_waits(
    alias: str, dedicated: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen inside a transaction, where what a statement sets for its transaction lasts
    # until the commit; the claims are told they run alone, as in autocommit.
    Store(alias).outbox.enqueue(new_run())
    monkeypatch.setattr(dedicated, "commits_alone", lambda: True)
    with dedicated.transaction():
        won(claim(dedicated))
        assert synchronous_commit(dedicated) == "on"
        assert lost(claim(dedicated, owner="w2:1")).why == "held"
        assert synchronous_commit(dedicated) == "off"
    assert synchronous_commit(dedicated) == "on"  # for that transaction only
    assert events(dedicated)[-1] == ("claim", "rejected")


def test_a_won_claim_of_an_exclusive_owner_commits_without_waiting_for_the_disk(
    alias: str, dedicated: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An owner that runs one attempt at a time (a prefork pool process) is told apart
    # from any later holder of a token a crash issued twice; one running several is not.
    Store(alias).outbox.enqueue(new_run("shared"))
    Store(alias).outbox.enqueue(new_run("exclusive"))
    monkeypatch.setattr(dedicated, "commits_alone", lambda: True)
    with dedicated.transaction():
        won(claim(dedicated, "shared"))
        assert synchronous_commit(dedicated) == "on"
        won(
            dedicated.runs.claim(
                "exclusive", 0, task_name="shop.charge", owner="w1:1", ttl=TTL,
                reserve=timedelta(0), max_lost_leases=3, exclusive=True,
            )
        )  # fmt: skip
        assert synchronous_commit(dedicated) == "off"
    assert synchronous_commit(dedicated) == "on"


def test_a_lost_claim_inside_a_transaction_leaves_the_transactions_commit_durable(
    alias: str, dedicated: Store
) -> None:
    Store(alias).outbox.enqueue(new_run())
    won(claim(Store(alias)))
    assert dedicated.commits_alone()
    with dedicated.transaction():
        assert not dedicated.commits_alone()
        lost(claim(dedicated, owner="w2:1"))
        assert synchronous_commit(dedicated) == "on"


def test_a_failed_statement_raises_djangos_error_and_the_next_one_runs(
    dedicated: Store,
) -> None:
    with pytest.raises(ProgrammingError):
        dedicated.execute("SELECT no_such_column FROM celery_deadlines_run", [])
    count, rows = dedicated.execute("SELECT 1 AS one", [])
    assert (count, rows) == (1, [(1,)])


def test_a_statement_that_returns_no_rows_reports_the_rows_it_changed(
    alias: str, dedicated: Store
) -> None:
    Store(alias).outbox.enqueue(new_run())
    count, rows = dedicated.execute(
        "UPDATE celery_deadlines_run SET op_detail = 'seen' WHERE task_id = %s", ["run-1"]
    )
    assert (count, rows) == (1, [])


def test_a_connection_lost_between_statements_is_replaced_by_the_next_one(
    alias: str, dedicated: Store
) -> None:
    [(pid,)] = dedicated.execute("SELECT pg_backend_pid()", [])[1]
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(OperationalError):  # Django's, as through Django's cursor
        dedicated.execute("SELECT 1", [])
    [(again,)] = dedicated.execute("SELECT pg_backend_pid()", [])[1]
    assert again != pid


def test_a_connection_left_out_of_autocommit_is_replaced_before_the_next_statement(
    alias: str, dedicated: Store
) -> None:
    """Django's check of a connection to drop runs when one of its causes may hold:
    here autocommit not restored (a transaction left open). The next statement runs on
    a new connection, in autocommit: what it writes is seen at once from another."""
    Store(alias).outbox.enqueue(new_run())
    [(pid,)] = dedicated.execute("SELECT pg_backend_pid()", [])[1]
    dedicated._threads.local.connection.set_autocommit(False)  # type: ignore[union-attr]
    dedicated.execute(
        "UPDATE celery_deadlines_run SET op_detail = 'seen' WHERE task_id = %s", ["run-1"]
    )
    [(again,)] = dedicated.execute("SELECT pg_backend_pid()", [])[1]
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT op_detail FROM celery_deadlines_run WHERE task_id = %s", ["run-1"])
        assert (cursor.fetchone(), again != pid) == (("seen",), True)


def test_a_statement_is_handed_to_psycopg_as_the_same_bytes_every_time(alias: str) -> None:
    """psycopg finds its parsing of a statement by the statement's hash: bytes made
    once keep theirs. A statement that is not ASCII, or one past the cap, is left to
    psycopg to encode."""
    statement = "SELECT 1 AS bytes_kept_once"
    first = connection_module._encoded(statement)
    assert first == statement.encode()
    assert connection_module._encoded_statements[statement] is first
    assert connection_module._encoded("SELECT 'é'") == "SELECT 'é'"
    kept = dict(connection_module._encoded_statements)
    try:
        connection_module._encoded_statements.update(
            (f"SELECT {n}", b"") for n in range(connection_module.ENCODED_STATEMENTS)
        )
        assert connection_module._encoded("SELECT 'past the cap'") == "SELECT 'past the cap'"
    finally:
        connection_module._encoded_statements.clear()
        connection_module._encoded_statements.update(kept)


def test_a_timed_statements_round_trip_reads_the_installed_clock_to_the_microsecond(
    dedicated: Store,
) -> None:
    start = datetime(2031, 5, 6, 7, 8, 9, 123457, tzinfo=UTC)
    with use_clock(FakeClock(start)):
        dedicated.database_now()
        assert dedicated.last_round_trip() == (start, start)


def test_a_dedicated_transaction_rolls_back_whole_on_the_direct_path(
    alias: str, dedicated: Store
) -> None:
    Store(alias).outbox.enqueue(new_run())

    def half_then_fail() -> None:
        with dedicated.transaction():
            dedicated.execute(
                "UPDATE celery_deadlines_run SET op_detail = 'half' WHERE task_id = %s",
                ["run-1"],
            )
            dedicated.execute("SELECT no_such_column FROM celery_deadlines_run", [])

    with pytest.raises(ProgrammingError):
        half_then_fail()
    [(detail,)] = dedicated.execute(
        "SELECT op_detail FROM celery_deadlines_run WHERE task_id = %s", ["run-1"]
    )[1]
    assert detail != "half"


def alias_set(monkeypatch: pytest.MonkeyPatch, alias: str, **changes: object) -> dict[str, Any]:
    """The alias's settings with ``changes``, for the connections opened from now on (a
    copy: the test's own connection keeps its dict)."""
    changed = {**connections.settings[alias], **changes}
    monkeypatch.setitem(connections.settings, alias, changed)
    return changed


@pytest.mark.parametrize(
    ("options", "prepared"),
    [
        ({}, True),
        # Django alone would prepare nothing here (its prepare_threshold is None)
        ({"server_side_binding": True}, True),
        ({"server_side_binding": True, "prepare_threshold": None}, False),
        ({"prepare_threshold": None}, False),
    ],
)
def test_a_dedicated_connection_prepares_its_statements_unless_the_alias_says_not_to(
    alias: str, monkeypatch: pytest.MonkeyPatch, options: dict[str, object], prepared: bool
) -> None:
    alias_set(monkeypatch, alias, OPTIONS=options)
    store = Store(alias, dedicated=True)
    try:
        store.database_now()
        store.database_now()  # prepared the second time it runs
        _, rows = store.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement = %s",
            [connection_module.DATABASE_NOW.text["postgresql"]],
        )
    finally:
        store.close()
    assert rows == [(1 if prepared else 0,)]


@pytest.mark.parametrize("application_first", [False, True])
def test_a_workers_claim_runs_beside_djangos_connection_pool(
    alias: str, monkeypatch: pytest.MonkeyPatch, application_first: bool
) -> None:
    """An alias pooled by Django (``OPTIONS["pool"]``, CONN_MAX_AGE 0): the worker's
    connection is its own, whether the application's pool exists already or not (a
    pool refuses a persistent connection, and one borrowed would never go back)."""
    from django.db.utils import load_backend

    pooled = alias_set(monkeypatch, alias, CONN_MAX_AGE=0, OPTIONS={"pool": True})
    application = load_backend(pooled["ENGINE"]).DatabaseWrapper(pooled, alias)
    worker = Store(alias, dedicated=True)
    try:
        if application_first:
            with application.cursor() as cursor:
                cursor.execute("SELECT 1")
            application.close()  # back to the pool
        Store(alias).outbox.enqueue(new_run(deadline=datetime.now(UTC) + TTL))
        lease = won(claim(worker))
        assert worker.runs.finish(lease, "w1:1", Status.SUCCEEDED)
        if application_first:
            stats = application.pool.get_stats()
            assert stats["requests_num"] == 1  # the application's cursor only
    finally:
        worker.close()
        application.close_pool()


def test_a_workers_claim_commits_when_the_alias_manages_transactions_by_hand(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``AUTOCOMMIT = False`` on the alias (system check E010 for the producer): the
    worker's own connection still commits each statement, or its claim would stay in
    a transaction nobody commits, invisible and holding the run's row."""
    alias_set(monkeypatch, alias, AUTOCOMMIT=False)
    Store(alias).outbox.enqueue(new_run(deadline=datetime.now(UTC) + TTL))
    worker = Store(alias, dedicated=True)
    try:
        won(claim(worker))
    finally:
        worker.close()
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT status FROM celery_deadlines_run WHERE task_id = %s", ["run-1"])
        assert cursor.fetchone() == ("RUNNING",)


def backend_pid_in_a_thread(store: Store, *, release: bool) -> int:
    """The server pid of the connection a new thread's statement runs on; the thread then
    hands its connection on, as a worker's job does when it ends (``release``), or
    closes it, as a thread that stops does."""
    import threading

    found: list[int] = []

    def job() -> None:
        [(pid,)] = store.execute("SELECT pg_backend_pid()", [])[1]
        found.append(pid)
        if release:
            store.release()
        else:
            store.close()

    thread = threading.Thread(target=job)
    thread.start()
    thread.join()
    return found[0]


def test_a_thread_whose_job_ended_hands_its_connection_to_the_next_thread(
    alias: str, dedicated: Store
) -> None:
    # a green pool runs each job in a greenlet of its own: each opened a connection
    first = backend_pid_in_a_thread(dedicated, release=True)
    assert backend_pid_in_a_thread(dedicated, release=True) == first
    closed = backend_pid_in_a_thread(dedicated, release=False)
    assert closed == first  # taken, and this time closed
    assert backend_pid_in_a_thread(dedicated, release=True) != first


def test_a_connection_inside_a_transaction_is_not_handed_on(alias: str, dedicated: Store) -> None:
    with dedicated.transaction():
        [(pid,)] = dedicated.execute("SELECT pg_backend_pid()", [])[1]
        dedicated.release()
        [(same,)] = dedicated.execute("SELECT pg_backend_pid()", [])[1]
    assert same == pid
    assert backend_pid_in_a_thread(dedicated, release=True) != pid  # still this thread's


def test_closing_a_store_closes_the_connections_threads_handed_on(
    alias: str, dedicated: Store
) -> None:
    pid = backend_pid_in_a_thread(dedicated, release=True)
    dedicated.close()

    def server_process_gone() -> bool:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            return bool(cursor.fetchone() == (0,))

    # the server process leaves pg_stat_activity as it exits, after the client's close
    # has returned: on a busy machine, moments later (one left open never leaves)
    wait_for(server_process_gone, timeout=10)
