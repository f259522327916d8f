"""The database cap on a fake clock: the timeout a statement is given, when a setting is
sent, and the connection as it was after the attempt (rules/database.py, core/database.py).

The wrapper runs on a stand-in for Django's PostgreSQL connection that records what is
sent to the server, and on a real SQLite connection; the real servers: tests/integration/
test_database_cap.py."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celery_deadlines import QueryCut, ledger
from celery_deadlines.core import database
from celery_deadlines.errors import InvalidDeadline
from celery_deadlines.rules import database as rule
from celery_deadlines.rules.budgets import Anchor
from celery_deadlines.testing import FakeClock, use_clock

START = datetime(2030, 1, 1, tzinfo=UTC)


# -- the arithmetic ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("remaining", "timeout"),
    [
        (3.0, 2700),  # a tenth of the time left kept
        (20.0, 19000),  # the headroom is at most a second
        (10.0, 9000),
        (0.0105, 9),  # rounded down, never up
        (0.002, 1),
        (0.001, None),  # under a millisecond: 0 would be "no timeout", not sent
        (0.0, None),
        (-1.0, None),
        (float("nan"), None),
    ],
)
def test_a_statement_is_given_the_time_left_less_its_headroom_in_whole_milliseconds_rounded_down(
    remaining: float, timeout: int | None
) -> None:
    assert rule.timeout_ms(remaining) == timeout


def test_a_timeout_sent_holds_only_while_a_statement_starting_now_would_end_by_the_deadline() -> (
    None
):
    deadline = 100.0
    assert rule.holds(2700, now=97.3, deadline=deadline)
    assert not rule.holds(2700, now=97.301, deadline=deadline)
    sent_at = 97.0
    timeout = rule.timeout_ms(deadline - sent_at)
    assert timeout is not None
    # it holds for the headroom after it was sent, and no longer
    assert rule.holds(timeout, sent_at + rule.headroom(3.0), deadline)
    assert not rule.holds(timeout, sent_at + rule.headroom(3.0) + 0.001, deadline)


def test_an_error_is_the_caps_only_when_the_statement_ran_as_long_as_its_timeout() -> None:
    assert rule.cut_by_cap(2700, elapsed=2.7)
    assert rule.cut_by_cap(2700, elapsed=2.699)  # the server counts from receiving it
    assert not rule.cut_by_cap(2700, elapsed=0.01)  # NOWAIT, or the server's own timeout


def test_the_setting_is_true_false_or_the_aliases_to_cap() -> None:
    assert rule.parse_cap(True, name="s") is True
    assert rule.parse_cap(False, name="s") is False
    assert rule.parse_cap(["default", "replica"], name="s") == frozenset({"default", "replica"})
    assert rule.chosen(frozenset({"replica"}), ["default", "replica"]) == ("replica",)
    assert rule.chosen(True, ["default", "replica"]) == ("default", "replica")
    assert rule.chosen(False, ["default"]) == ()


@pytest.mark.parametrize("value", ["yes", 1, None, "default", [""], ["default", 3], {"a": 1}])
def test_a_setting_that_is_neither_a_flag_nor_aliases_is_refused_naming_it(value: Any) -> None:
    with pytest.raises(InvalidDeadline, match=r"^s must be True, False or a list of database"):
        rule.parse_cap(value, name="s")


def test_the_cut_names_the_statement_by_its_first_characters_as_any_value_from_outside() -> None:
    sql = "SELECT " + "x, " * 200 + "\x1b[31m"
    detail = rule.cut_detail(sql, "default", "statement_timeout")
    assert detail.startswith("the query 'SELECT x, x, ")
    assert "..." in detail
    assert len(detail) < 200
    assert "on database 'default' was cut by the deadline (statement_timeout)" in detail


# -- the wrapper on PostgreSQL (a stand-in connection) -------------------------------------


class Server:
    """What the stand-in's server was sent, and its transaction status."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.status = 0  # psycopg: IDLE

    @property
    def sets(self) -> list[bool]:
        """The settings sent, each ``True`` when the transaction's (SET LOCAL)."""
        return [params[2] for sql, params in self.sent if sql.startswith("SELECT set_config")]


class RawCursor:
    def __init__(self, server: Server) -> None:
        self.server = server

    def __enter__(self) -> RawCursor:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def execute(self, sql: str, params: Any = None) -> None:
        self.server.sent.append((sql, params))


class Info:
    def __init__(self, server: Server) -> None:
        self.server = server

    @property
    def transaction_status(self) -> int:
        return self.server.status


class Raw:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.info = Info(server)
        self.closed = False

    def cursor(self) -> RawCursor:
        return RawCursor(self.server)

    def close(self) -> None:
        self.closed = True


class Pool:
    """Django's connection pool (psycopg_pool), as the cap sees it: drained or not."""

    def __init__(self) -> None:
        self.drains = 0

    def drain(self) -> None:
        self.drains += 1


class Nothing:
    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: Any) -> None:
        pass


class Connection:
    """The parts of Django's PostgreSQL wrapper the cap uses."""

    vendor = "postgresql"

    def __init__(self, **settings: Any) -> None:
        self.server = Server()
        self.connection: Any = Raw(self.server)
        self.autocommit = True
        self.settings_dict = settings
        self.execute_wrappers: list[Any] = []
        self.wrap_database_errors = Nothing()
        self.closed = False
        self.pool = Pool()
        #: the driver connections closed under Django's close (a pool takes them back)
        self.given_back: list[Any] = []

    def run(self, sql: str) -> None:
        """A statement of the body, through the execute wrappers."""

        def execute(sql: str, params: Any, many: bool, context: Any) -> None:
            self.server.sent.append((sql, params))
            if self.server.status == 0 and not self.autocommit:
                self.server.status = 2  # INTRANS

        call = execute
        for wrapper in reversed(self.execute_wrappers):
            call = _bind(wrapper, call)
        call(sql, None, False, {})

    def close(self) -> None:
        self.closed = True
        self.given_back.append(self.connection)
        self.connection = None


def _bind(wrapper: Any, inner: Any) -> Any:
    return lambda sql, params, many, context: wrapper(inner, sql, params, many, context)


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    fake = FakeClock(START)
    with use_clock(fake):
        yield fake


def cap_on(connection: Connection, clock: FakeClock, budget: float) -> Any:
    anchor = Anchor.at(START + timedelta(seconds=budget), clock.now(), clock.monotonic())
    cap = database._Cap("default", connection, anchor)
    connection.execute_wrappers.append(cap)
    return cap


def test_a_hundred_quick_statements_send_one_setting_and_a_statement_after_the_headroom_another(
    clock: FakeClock,
) -> None:
    connection = Connection()
    cap_on(connection, clock, budget=30.0)
    for _ in range(100):
        connection.run("SELECT 1")
        clock.advance(0.001)
    assert connection.server.sets == [False]  # once, the session's (autocommit)
    clock.advance(1.0)  # past the headroom (a second, with 30 s left)
    connection.run("SELECT 1")
    assert connection.server.sets == [False, False]
    timeouts = [params[0] for sql, params in connection.server.sent if params]
    assert timeouts == [29000, 27900]  # each the time left (28.9 s) less its headroom


def test_inside_a_transaction_the_setting_is_the_transactions_and_a_new_transaction_sends_it_again(
    clock: FakeClock,
) -> None:
    connection = Connection()
    cap_on(connection, clock, budget=30.0)
    connection.autocommit = False
    connection.run("UPDATE t SET n = 1")
    connection.run("UPDATE t SET n = 2")
    assert connection.server.sets == [True]
    connection.server.status = 0  # committed: SET LOCAL went with it
    connection.run("UPDATE t SET n = 3")
    assert connection.server.sets == [True, True]
    connection.run('ROLLBACK TO SAVEPOINT "s1"')  # may undo a SET LOCAL made since
    connection.run("UPDATE t SET n = 4")
    assert connection.server.sets == [True, True, True]


def test_a_session_setting_sent_before_a_transaction_still_holds_inside_it(
    clock: FakeClock,
) -> None:
    connection = Connection()
    cap_on(connection, clock, budget=30.0)
    connection.run("SELECT 1")
    connection.autocommit = False
    connection.run("UPDATE t SET n = 1")
    assert connection.server.sets == [False]


def test_behind_pgbouncer_only_a_transactions_statements_are_capped(clock: FakeClock) -> None:
    connection = Connection(DISABLE_SERVER_SIDE_CURSORS=True)
    cap_on(connection, clock, budget=30.0)
    connection.run("SELECT 1")
    assert connection.server.sets == []  # a session's SET would outlive the statement
    connection.autocommit = False
    connection.run("UPDATE t SET n = 1")
    assert connection.server.sets == [True]


def test_a_statement_with_no_time_left_is_not_sent_and_raises_query_cut(clock: FakeClock) -> None:
    connection = Connection()
    cap_on(connection, clock, budget=1.0)
    clock.advance(1.0)
    with pytest.raises(QueryCut) as cut:
        connection.run("SELECT * FROM orders")
    assert (cut.value.gate, cut.value.reason) == ("database", "deadline_passed")
    assert "the query 'SELECT * FROM orders' on database 'default'" in cut.value.detail
    assert connection.server.sent == []


def test_a_transactions_end_runs_whatever_the_time_and_nothing_is_sent_before_it(
    clock: FakeClock,
) -> None:
    """A body's cleanup after a cut (``atomic()``'s rollback to its savepoint, in a
    transaction the cut aborted) must run: a SET before it would fail there."""
    connection = Connection()
    cap_on(connection, clock, budget=1.0)
    connection.autocommit = False
    connection.run('SAVEPOINT "s1"')
    connection.run("UPDATE t SET n = 1")
    clock.advance(5.0)  # the deadline has passed
    connection.run('ROLLBACK TO SAVEPOINT "s1"')
    connection.run('RELEASE SAVEPOINT "s1"')
    sent = [sql for sql, _ in connection.server.sent if not sql.startswith("SELECT set_config")]
    assert sent == [
        'SAVEPOINT "s1"',
        "UPDATE t SET n = 1",
        'ROLLBACK TO SAVEPOINT "s1"',
        'RELEASE SAVEPOINT "s1"',
    ]
    assert connection.server.sets == [True]  # for the UPDATE alone


def test_a_session_setting_the_wrapper_forgot_is_still_reset_after_the_attempt(
    clock: FakeClock,
) -> None:
    """A body's own ROLLBACK makes the wrapper send its setting again before the next
    statement; the session's setting sent before it is still reset at the end."""
    connection = Connection()
    cap = cap_on(connection, clock, budget=30.0)
    connection.run("SELECT 1")
    connection.run("ROLLBACK")
    cap.restore()
    assert connection.server.sent[-1] == (database._RESET, None)


def test_the_ledgers_own_statements_run_uncut_with_the_sessions_defaults(clock: FakeClock) -> None:
    connection = Connection()
    cap_on(connection, clock, budget=1.0)
    connection.run("SELECT 1")
    clock.advance(5.0)  # the deadline has passed
    ledger.own_statements.depth += 1
    try:
        connection.run("INSERT INTO celery_deadlines_run ...")
    finally:
        ledger.own_statements.depth -= 1
    sent = [sql for sql, _ in connection.server.sent]
    assert sent[-2:] == [database._RESET, "INSERT INTO celery_deadlines_run ..."]


def test_after_the_attempt_the_settings_are_reset_and_a_connection_that_cannot_be_is_closed(
    clock: FakeClock,
) -> None:
    connection = Connection()
    cap = cap_on(connection, clock, budget=30.0)
    cap.restore()
    assert connection.server.sent == []  # nothing sent: nothing to reset
    connection.run("SELECT 1")
    cap.restore()
    assert connection.server.sent[-1] == (database._RESET, None)
    connection.run("SELECT 1")

    def broken() -> None:
        raise OSError("the server went away")

    raw = connection.connection
    raw.cursor = broken
    cap.restore()
    assert connection.closed
    # closed before Django's close: a pool discards it rather than lend it with the timeouts
    assert connection.given_back == [raw]
    assert raw.closed


@pytest.mark.parametrize("next_statement", [False, True])
def test_a_pooled_connection_the_body_gave_back_with_a_session_setting_is_drained_from_its_pool(
    clock: FakeClock, next_statement: bool
) -> None:
    """``connection.close()`` in the body gives a connection of Django's pool back as it
    is, the session's timeouts in force: the pool is drained (the connection closed) when
    the cap next sees the alias, at the body's next statement or its end."""
    connection = Connection(OPTIONS={"pool": True})
    cap = cap_on(connection, clock, budget=30.0)
    connection.run("SELECT 1")
    connection.close()  # given back
    if next_statement:
        connection.connection = Raw(connection.server)  # borrowed again: another one
        connection.run("SELECT 2")
        assert connection.pool.drains == 1
    cap.restore()
    assert connection.pool.drains == 1


def test_a_pool_is_left_alone_when_nothing_was_set_or_the_connection_given_back_was_not_pooled(
    clock: FakeClock,
) -> None:
    pooled = Connection(OPTIONS={"pool": True})
    cap = cap_on(pooled, clock, budget=30.0)
    pooled.close()  # before any statement: nothing was set on it
    cap.restore()
    kept = Connection(OPTIONS={"pool": True})
    cap = cap_on(kept, clock, budget=30.0)
    kept.run("SELECT 1")
    cap.restore()  # reset on the connection itself, which the body kept
    unpooled = Connection()
    cap = cap_on(unpooled, clock, budget=30.0)
    unpooled.run("SELECT 1")
    unpooled.close()  # really closed: the timeouts went with it
    cap.restore()
    assert (pooled.pool.drains, kept.pool.drains, unpooled.pool.drains) == (0, 0, 0)


def test_a_transactions_setting_in_a_transaction_a_cut_aborted_is_left_to_its_rollback(
    clock: FakeClock,
) -> None:
    """An eager run inside the caller's transaction: a cut statement aborts it, and a
    RESET would fail (and the connection be closed under the caller): the rollback the
    caller must make takes the SET LOCAL with it."""
    connection = Connection()
    cap = cap_on(connection, clock, budget=30.0)
    connection.autocommit = False
    connection.run("UPDATE t SET n = 1")
    connection.server.status = 3  # INERROR: the transaction is aborted
    cap.restore()
    assert connection.server.sets == [True]
    assert database._RESET not in [sql for sql, _ in connection.server.sent]
    assert not connection.closed


# -- the wrapper on SQLite -----------------------------------------------------------------


class SQLite:
    """The parts of Django's SQLite wrapper the cap uses, on a real connection."""

    vendor = "sqlite"

    def __init__(self) -> None:
        self.connection = sqlite3.connect(":memory:")
        self.settings_dict: dict[str, Any] = {}
        self.execute_wrappers: list[Any] = []

    def run(self, sql: str) -> Any:
        def execute(sql: str, params: Any, many: bool, context: Any) -> Any:
            return self.connection.execute(sql).fetchall()

        call = execute
        for wrapper in reversed(self.execute_wrappers):
            call = _bind(wrapper, call)
        return call(sql, None, False, {})


SLOW = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000000) "
    "SELECT count(*) FROM n"
)


@pytest.fixture
def sqlite() -> Iterator[SQLite]:
    """A real SQLite connection behind the wrapper's parts, closed after the test (an
    unclosed one is a ResourceWarning on Python 3.13, wherever it is collected)."""
    connection = SQLite()
    yield connection
    connection.connection.close()


def test_a_sqlite_statement_past_its_time_is_interrupted_and_raises_query_cut(
    clock: FakeClock, sqlite: SQLite
) -> None:
    connection = sqlite
    cap = cap_on(connection, clock, budget=3.0)  # type: ignore[arg-type]
    assert connection.run("SELECT 1") == [(1,)]
    real = cap._progress

    def later() -> int:
        clock.advance(1.0)  # each look at the clock finds a second gone
        stop: int = real()
        return stop

    connection.connection.set_progress_handler(later, database.SQLITE_STEPS)
    with pytest.raises(QueryCut) as cut:
        connection.run(SLOW)
    assert "(interrupted)" in cut.value.detail
    assert isinstance(cut.value.__cause__, sqlite3.OperationalError)
    cap.restore()
    connection.execute_wrappers.clear()  # the attempt is over: nothing interrupts it
    assert connection.run("SELECT 2") == [(2,)]
