"""The ledger's connection: one Django database alias, dedicated or shared, and the clock.

:class:`Store` runs statements and reads the database clock; the statements themselves
are grouped by who asks for them, each a small class on the store's connection:

``store.outbox``    the producer: the run's row before its message
``store.runs``      the attempt: claim, fenced writes, refusals
``store.supervision``  the worker's main process, about its own pool processes
``store.sweeps``    the reconciler and the scheduler (lapsed leases, expiry, republish,
                    occurrences)
``store.operator``  the admin's actions (expire now, requeue)
``store.effects``   the effect ledger (intent, dispatch guard, outcomes, settlement)
``store.plans``     plans stored with the run
``store.retention`` the purge of ended runs (the reconciler and the operator's command)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, Final

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import load_backend

from ... import clock
from .. import own_statements
from .console import Console
from .dialect import Dialect, dialect_for
from .effects import Effects
from .operator import OperatorActions
from .outbox import Outbox
from .plans import Plans
from .retention import Retention
from .rows import required
from .runs import Runs
from .statements import queries
from .supervision import Supervision
from .sweeps import Sweeps

#: A dedicated connection idle longer than this is pinged before its next statement.
IDLE_PING: Final = 1.0
#: A dedicated PostgreSQL connection prepares a statement the second time it runs it
#: (the worker's statements are few and run for every task: the claim's plan alone
#: costs more than its execution).
PREPARE_THRESHOLD: Final = 1
#: The database clock, read alone.
DATABASE_NOW: Final = queries("store")["database_now"]
#: The statements encoded once (:func:`_encoded`) are at most this many.
ENCODED_STATEMENTS: Final = 256

_encoded_statements: dict[str, bytes] = {}


def _encoded(sql: str) -> bytes | str:
    """``sql`` as the bytes psycopg sends, the same object each time it runs (read from
    :data:`_encoded_statements` once there): psycopg looks up its parsing of a statement
    by the statement's hash, and a string is encoded into new bytes at every run,
    hashed again (12,000 instructions for the claim's 4,000 characters). Statements
    built at run time beyond the first :data:`ENCODED_STATEMENTS` are left to psycopg,
    and so is any that is not ASCII (whose bytes depend on the connection's encoding)."""
    if len(_encoded_statements) >= ENCODED_STATEMENTS or not sql.isascii():
        return sql
    encoded = _encoded_statements[sql] = sql.encode()
    return encoded


def dedicated_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """A dedicated connection's settings: the alias's, kept open, and on PostgreSQL
    (psycopg 3) with server-side binding and prepared statements, unless the alias's
    ``OPTIONS`` say how to prepare (``"prepare_threshold": None`` turns them off, for a
    connection pooler that cannot keep them, such as PgBouncer before 1.21 in
    transaction mode) or to bind on the client (``"server_side_binding": False``, where
    nothing can be prepared): then as they say.

    ``"server_side_binding": True`` alone says nothing about preparing: Django then
    prepares nothing on its own connections (its default ``prepare_threshold`` is
    ``None``), but this connection still does.

    Django's connection pool (``"pool"``, Django 5.1+) is left to the alias: this
    connection is one kept open of its own, which a pool refuses ("Pooling doesn't
    support persistent connections"), and one borrowed from the application's pool
    would never go back to it. Its statements commit on their own (``AUTOCOMMIT``,
    whatever the alias says; :meth:`Store.transaction` groups them)."""
    options = dict(settings.get("OPTIONS") or {})
    options.pop("pool", None)
    if (
        "postgresql" in str(settings.get("ENGINE", ""))
        and "prepare_threshold" not in options
        and options.get("server_side_binding", True) is True
    ):
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        if is_psycopg3:
            options.update(server_side_binding=True, prepare_threshold=PREPARE_THRESHOLD)
    return {**settings, "CONN_MAX_AGE": None, "AUTOCOMMIT": True, "OPTIONS": options}


class _Local:
    """A store's state in one thread: its dedicated connection and what goes with it.

    A plain object, reached once per statement through :class:`_Threads`: an attribute
    of a ``threading.local`` costs six times a plain one's, and a statement reads ten.
    """

    __slots__ = ("connection", "cursor", "direct", "pid", "pinned", "raw", "round_trip", "used_at")

    #: the last timed statement's round trip, in epoch seconds (unset before the
    #: first: :meth:`Store.last_round_trip`)
    round_trip: tuple[float, float]

    def __init__(self) -> None:
        self.connection: BaseDatabaseWrapper | None = None
        self.pid = 0
        self.used_at = 0.0
        self.pinned: BaseDatabaseWrapper | None = None
        #: statements run on the connection's own cursor (:meth:`Store._execute_direct`)
        self.direct = False
        self.cursor: Any = None
        self.raw: Any = None  # the database connection ``cursor`` belongs to


class _Threads(threading.local):
    """Each thread's :class:`_Local`: ``None`` until the thread's first statement, and
    again once the thread hands it on (:meth:`Store.release`)."""

    local: _Local | None = None


def _direct_capable(connection: BaseDatabaseWrapper) -> bool:
    """Whether statements may run on the connection's own cursor (PostgreSQL through
    psycopg 3, which takes the ledger's ``%s`` and ``%(name)s`` placeholders as they
    are written; Django's SQLite cursor rewrites them)."""
    if connection.vendor != "postgresql":
        return False
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


def _load_instants_natively(cursor: Any) -> None:
    """Read ``timestamptz`` columns on ``cursor`` with psycopg's own loader (its C one,
    when psycopg has its C implementation) instead of Django's: Django's is written in
    Python and re-stamps every value with the connection's zone, which a dedicated
    connection does not need: Django set its session to UTC (``USE_TZ``, check E004),
    and :meth:`Dialect.instant` makes any aware value UTC."""
    from psycopg import adapters
    from psycopg.pq import Format

    oid = adapters.types["timestamptz"].oid
    cursor.adapters.register_loader(oid, adapters.get_loader(oid, Format.TEXT))


class Store:
    """The ledger's statements on one Django database alias.

    ``dedicated=False`` (the producer's store) runs them on Django's connection for the
    alias, so the outbox row joins the caller's transaction. ``dedicated=True`` (the
    worker's) runs them on a connection of its own per process and thread, kept open
    across tasks: Celery's Django fixup closes Django's connections before and after
    every task, and a new connection costs more than the ledger's statements. Its writes
    commit at once (autocommit), whatever transaction the task body has open.
    """

    def __init__(self, using: str = "default", *, dedicated: bool = False) -> None:
        self.using = using
        self.dedicated = dedicated
        self._dialect: Dialect | None = None
        self._threads = _Threads()
        #: the states (with their connections) threads handed on, for the next to take
        self._idle: list[_Local] = []

    @property
    def dialect(self) -> Dialect:
        if self._dialect is None:
            self._dialect = dialect_for(connections[self.using].vendor)
        return self._dialect

    def _connection(self, local: _Local) -> BaseDatabaseWrapper:
        """This thread's connection (``local``: its state); a dedicated one is opened on
        first use, checked as Django checks its own, pinged after an idle spell."""
        if not self.dedicated:
            return connections[self.using]
        pinned = local.pinned
        if pinned is not None:  # inside transaction(): never reconnect halfway
            return pinned
        connection = local.connection
        if connection is None or local.pid != os.getpid():  # first use, or a forked child
            settings = dedicated_settings(connections.settings[self.using])
            wrapper = load_backend(settings["ENGINE"]).DatabaseWrapper
            connection = local.connection = wrapper(settings, self.using)
            # one thread at a time uses it, several in turn (release): Django's check
            # that a connection stays in the thread that made it would refuse the next
            connection.inc_thread_sharing()
            local.pid = os.getpid()
            local.direct = _direct_capable(connection)
            local.cursor = local.raw = None
            local.used_at = clock.monotonic()
        if (
            connection.errors_occurred
            or not connection.autocommit
            or connection.close_at is not None
        ):
            # Django's own test of a connection to drop (the next statement reconnects),
            # asked when one of its three causes may hold: an error since the last
            # statement, autocommit not restored (or no connection), an age limit
            connection.close_if_unusable_or_obsolete()
        now = clock.monotonic()
        # a connection idle through a database restart or a network cut fails its next
        # statement; a claim must not fail for that: ping it first, reconnect if dead
        idle = now - local.used_at > IDLE_PING and connection.connection is not None
        if idle and not connection.is_usable():
            connection.close()
        local.used_at = now
        return connection

    def _take(self) -> _Local:
        """This thread's state, at its first statement (or its first since it handed its
        state on): one a thread handed on (:meth:`release`), with its connection, else a
        new one."""
        try:
            local = self._idle.pop()
        except IndexError:
            local = _Local()
        self._threads.local = local
        return local

    def release(self) -> None:
        """Hand this thread's dedicated connection on to the next thread that needs one
        (a worker's job has ended). A green pool runs each job in a greenlet of its own
        that ends with it: without this, every job opened a connection of its own, and
        kept it until the greenlet was collected (a gevent worker of concurrency 10 held
        91 after 400 jobs). Never inside :meth:`transaction`; a connection is used by
        one thread at a time."""
        local = self._threads.local
        if not self.dedicated or local is None or local.pinned is not None:
            return
        self._threads.local = None
        self._idle.append(local)

    def close(self) -> None:
        """Close this thread's dedicated connection and those threads handed on (a thread
        that stops calls this, and a test before its database is dropped)."""
        idle, self._idle = self._idle, []
        for local in (self._threads.local, *idle):
            if local is None:
                continue
            connection = local.connection
            if connection is not None and local.pid == os.getpid():
                connection.close()
                if connection.connection is not None:
                    # Django keeps an in-memory SQLite database open on close(), lest the
                    # data go with it; this connection is the store's own, never the last
                    connection.connection.close()
                    connection.connection = None
            local.connection = local.cursor = local.raw = None

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """The statements run inside as one transaction: committed at the end, rolled
        back on an error. The producer's store joins Django's (``atomic``); a dedicated
        connection leaves autocommit for it (and is closed if it cannot roll back: the
        next statement reconnects, in autocommit)."""
        if not self.dedicated:
            own = own_statements  # its savepoints are the ledger's own statements too
            own.depth += 1
            try:
                with transaction.atomic(using=self.using):
                    own.depth -= 1
                    try:
                        yield
                    finally:
                        own.depth += 1
            finally:
                own.depth -= 1
            return
        local = self._threads.local or self._take()
        connection = self._connection(local)
        connection.set_autocommit(False)
        local.pinned = connection
        try:
            yield
            connection.commit()
            connection.set_autocommit(True)
        except BaseException:
            try:
                connection.rollback()
                connection.set_autocommit(True)
            except Exception:  # noqa: BLE001 (a broken connection: drop it, reconnect later)
                connection.close()
            raise
        finally:
            local.pinned = None

    def execute(
        self, sql: str, params: list[Any] | dict[str, Any], *, timed: bool = False
    ) -> tuple[int, list[tuple[Any, ...]]]:
        """Run one statement; (rows affected, rows returned). ``timed``: the statement
        returns the database clock; the local clock is read just before and after the
        statement itself (:meth:`last_round_trip`), so it is a clock reading whatever
        reconnecting or pinging the connection took."""
        local = self._threads.local or self._take()
        connection = self._connection(local)
        if local.direct:
            return self._execute_direct(local, connection, sql, params, timed)
        if not self.dedicated:
            # the application's connection: the database cap lets the ledger's own
            # statements run uncut (never the body's, whatever time it has left)
            own = own_statements
            own.depth += 1
            try:
                return self._execute_wrapped(local, connection, sql, params, timed)
            finally:
                own.depth -= 1
        return self._execute_wrapped(local, connection, sql, params, timed)

    def _execute_wrapped(
        self,
        local: _Local,
        connection: BaseDatabaseWrapper,
        sql: str,
        params: Any,
        timed: bool,
    ) -> tuple[int, list[tuple[Any, ...]]]:
        """:meth:`execute` through Django's cursor (its execute wrappers and query log)."""
        with connection.cursor() as cursor:
            if not timed:
                cursor.execute(sql, params)
                return cursor.rowcount, (cursor.fetchall() if cursor.description else [])
            sent = clock.epoch()
            cursor.execute(sql, params)
            rows = cursor.fetchall() if cursor.description else []
            local.round_trip = (sent, clock.epoch())
            return cursor.rowcount, rows

    def _execute_direct(
        self,
        local: _Local,
        connection: BaseDatabaseWrapper,
        sql: str,
        params: Any,
        timed: bool,
    ) -> tuple[int, list[tuple[Any, ...]]]:
        """:meth:`execute` on a dedicated psycopg 3 connection: on psycopg's cursor, made
        once per connection by Django's backend (its time zone loaders) and kept, with
        Django's error translation (``wrap_database_errors``: Django's exceptions, and a
        connection that failed is checked before its next statement), and nothing else
        of Django's cursor wrapper. Its query log and execute wrappers belong to the
        connections the application shares; this one is the library's own, and the
        wrapper costs more than the rest of the client's work on a claim."""
        try:
            if connection.connection is None:
                connection.ensure_connection()
            raw = connection.connection
            cursor = local.cursor
            if local.raw is not raw or cursor is None:
                cursor = local.cursor = connection.create_cursor()
                _load_instants_natively(cursor)
                local.raw = raw
            query = _encoded_statements.get(sql) or _encoded(sql)
            if not timed:
                cursor.execute(query, params)
                result = cursor.pgresult
                rows = cursor.fetchall() if result is not None and result.nfields else []
                return cursor.rowcount, rows
            sent = clock.epoch()
            cursor.execute(query, params)
            result = cursor.pgresult
            rows = cursor.fetchall() if result is not None and result.nfields else []
            local.round_trip = (sent, clock.epoch())
            return cursor.rowcount, rows
        except Exception:
            # Django's translation, entered on the way out only (its context manager
            # is two calls more on every statement): the driver's error raised as
            # Django's, the connection marked for the check before its next statement
            with connection.wrap_database_errors:
                raise

    def commits_alone(self) -> bool:
        """Whether this thread's next statement is a transaction of its own (autocommit,
        no transaction open): what it sets for its transaction ends with it."""
        if self.dedicated:
            local = self._threads.local
            return local is None or local.pinned is None
        return bool(connections[self.using].get_autocommit())

    def last_round_trip(self) -> tuple[datetime, datetime]:
        """This thread's last timed statement: the local clock when it was sent and
        answered. Read in epoch seconds around the statement (a datetime is dearer,
        and most claims never ask): a float keeps every microsecond of an instant
        before the year 2242."""
        sent, answered = (self._threads.local or self._take()).round_trip
        return datetime.fromtimestamp(sent, UTC), datetime.fromtimestamp(answered, UTC)

    def database_now(self) -> datetime:
        """The database clock."""
        d = self.dialect
        _, rows = self.execute(DATABASE_NOW.text[d.vendor], [], timed=True)
        return required(d.instant(rows[0][0]))

    @cached_property
    def outbox(self) -> Outbox:
        return Outbox(self)

    @cached_property
    def runs(self) -> Runs:
        return Runs(self)

    @cached_property
    def supervision(self) -> Supervision:
        return Supervision(self)

    @cached_property
    def sweeps(self) -> Sweeps:
        return Sweeps(self)

    @cached_property
    def operator(self) -> OperatorActions:
        return OperatorActions(self)

    @cached_property
    def console(self) -> Console:
        return Console(self)

    @cached_property
    def effects(self) -> Effects:
        return Effects(self)

    @cached_property
    def plans(self) -> Plans:
        return Plans(self)

    @cached_property
    def retention(self) -> Retention:
        return Retention(self)
