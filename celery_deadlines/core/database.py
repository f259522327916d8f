"""The deadline reaches the database: a body's queries end by the run's deadline.

While a DeadlineTask's body runs (``DeadlineTask.__call__``, where a ledger can be on:
the Django app is installed), each database alias the ``deadlines_database_cap``
setting names gets an execute wrapper (Django's ``connection.execute_wrappers``) on
this thread's connection, removed when the body ends. Before each statement it reads
the time left (:func:`celery_deadlines.clock.monotonic`) and:

* **PostgreSQL**: sends ``statement_timeout`` and ``lock_timeout`` from the time left
  (:func:`celery_deadlines.rules.database.timeout_ms`), only when the value sent earlier
  would let this statement run past the deadline (:func:`~celery_deadlines.rules.
  database.holds`), and never longer than the session's own (a server, role or
  connection default). Outside a transaction the setting is the session's (``SET``),
  reset when the body ends (``RESET``), so the next task on a persistent connection
  (``CONN_MAX_AGE``, Django's pool) reads the server's defaults; inside one it is the
  transaction's (``SET LOCAL``), gone at its end. An alias with
  ``DISABLE_SERVER_SIDE_CURSORS`` (what Django asks of PgBouncer in transaction mode)
  gets the transaction's form only: a session's setting would outlive the transaction
  on a server connection another client gets next;
* **SQLite**: a progress handler on the raw connection interrupts the statement at the
  deadline;
* **any other database** (MySQL, MariaDB, Oracle): nothing is sent; a statement is not
  started once the deadline has passed (docs/howto/database-cap.md: not capped).

A statement cut by the cap raises :class:`~celery_deadlines.errors.QueryCut` (the
driver's error is its cause); one the deadline leaves no time for is not sent and
raises it too. The ledger's own statements on the application's connection (an outbox
row the body's publish writes) are never cut (:data:`celery_deadlines.ledger.own_statements`).
When the body ends, whatever it ended with, each connection is put back as it was: the
settings reset and the progress handler removed, or, if that fails, the connection
closed (the next statement reconnects, with the server's defaults; a pool discards it).
A pooled connection (Django's ``OPTIONS["pool"]``) the body gave back itself with a
session's setting in force is closed too: the pool is drained (:meth:`_Cap._gone_back`).

A statement the body runs on a connection it opened itself, in another thread, or on
the raw driver connection (``connection.connection``) is not capped.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, Final

from .. import clock, ledger
from ..conf import DATABASE_CAP, settings_for
from ..errors import QueryCut
from ..rules import database as rule
from ..rules.budgets import Anchor
from ..rules.gates import Gate, Reason

logger = logging.getLogger("celery_deadlines")

#: Both timeouts from one value, never longer than the session's own (0: none), in
#: one round trip; the last parameter: the transaction's (``SET LOCAL``) or the session's.
_SET: Final = (
    "SELECT set_config('statement_timeout', CASE WHEN "
    "current_setting('statement_timeout')::interval > '0' AND "
    "current_setting('statement_timeout')::interval < make_interval(secs => %s / 1000.0) "
    "THEN current_setting('statement_timeout') ELSE %s END, %s), "
    "set_config('lock_timeout', CASE WHEN "
    "current_setting('lock_timeout')::interval > '0' AND "
    "current_setting('lock_timeout')::interval < make_interval(secs => %s / 1000.0) "
    "THEN current_setting('lock_timeout') ELSE %s END, %s)"
)
#: The session's defaults back (the server's, the role's, the connection's options).
_RESET: Final = "RESET statement_timeout; RESET lock_timeout"
#: PostgreSQL's errors for a statement its statement_timeout or lock_timeout ended.
_TIMEOUT_STATES: Final = frozenset({"57014", "55P03"})
#: SQLite's virtual machine instructions between two looks at the clock.
SQLITE_STEPS: Final = 10_000
#: psycopg's (2 and 3) transaction status of a connection with no transaction open, and
#: of a transaction a failed statement aborted.
_IDLE: Final = 0
_INERROR: Final = 3
#: "No statement may start under it" (nothing sent), and "never cut".
_NEVER: Final = float("-inf")
_ALWAYS: Final = float("inf")


class _Cap:
    """One connection's cap during one attempt: the execute wrapper, and what it sent."""

    __slots__ = (
        "alias",
        "anchor",
        "connection",
        "cut_at",
        "deadline",
        "interrupted",
        "kind",
        "local",
        "local_only",
        "local_sent",
        "local_until",
        "pooled",
        "raw",
        "session",
        "session_sent",
        "session_until",
    )

    def __init__(self, alias: str, connection: Any, anchor: Anchor) -> None:
        self.alias = alias
        self.connection = connection
        self.anchor = anchor
        self.deadline = anchor.deadline_monotonic()
        self.kind = connection.vendor
        #: the driver connection the settings were sent on (another one has the defaults)
        self.raw: Any = None
        #: the timeout (ms) sent for the session, and for the open transaction, and the
        #: latest start each lets end by the deadline (``rule.last_start``)
        self.session: int | None = None
        self.local: int | None = None
        self.session_until = self.local_until = _NEVER
        #: whether a setting was sent on ``raw`` for the session, or for a transaction
        #: (what ``restore`` resets: what the wrapper forgot may still be in force)
        self.session_sent = self.local_sent = False
        #: PgBouncer in transaction mode (Django's advice): the transaction's form only
        self.local_only = bool(connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"))
        #: Django's connection pool (``OPTIONS["pool"]``): a connection closed goes back to it
        self.pooled = bool((connection.settings_dict.get("OPTIONS") or {}).get("pool"))
        #: when the progress handler stops the running statement (SQLite), and whether it did
        self.cut_at = self.deadline
        self.interrupted = False

    def __call__(
        self, execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any
    ) -> Any:
        if ledger.own_statements.depth:
            if self._may_be_in_force():
                self._reset()  # the ledger's statement runs with the session's defaults
            return execute(sql, params, many, context)
        if type(sql) is str and sql.lstrip()[:3].upper() in _CONTROL:
            return self._control(execute, sql, params, many, context)
        now = clock.monotonic()
        kind = self.kind
        if kind == "postgresql":
            return self._postgres(execute, sql, params, many, context, now)
        timeout = rule.timeout_ms(self.deadline - now)
        if timeout is None:
            raise self._cut(sql, "not sent: the deadline had passed")
        if kind != "sqlite":
            return execute(sql, params, many, context)
        raw = self.connection.connection
        if raw is not self.raw:
            raw.set_progress_handler(self._progress, SQLITE_STEPS)
            self.raw = raw
        # as PostgreSQL's timeout would: the body keeps the headroom to end its run
        self.cut_at = now + timeout / 1000
        self.interrupted = False
        try:
            return execute(sql, params, many, context)
        except Exception as exc:
            if self.interrupted:
                raise self._cut(sql, "interrupted") from exc
            raise

    def _control(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        """A statement that ends a transaction or a savepoint, or sets the session: run as
        it is, whatever the time (a body's cleanup after a cut, ``atomic()``'s rollback to
        its savepoint, must run; nothing is sent before it, in a transaction a cut may
        have aborted)."""
        self.cut_at = _ALWAYS  # SQLite's progress handler lets it be
        try:
            return execute(sql, params, many, context)
        finally:
            if _resets(sql):
                self._forget()  # the settings sent may no longer be in force

    def _progress(self) -> int:
        """SQLite's progress handler: non-zero stops the statement."""
        if clock.monotonic() >= self.cut_at:
            self.interrupted = True
            return 1
        return 0

    def _postgres(
        self,
        execute: Callable[..., Any],
        sql: Any,
        params: Any,
        many: bool,
        context: Any,
        now: float,
    ) -> Any:
        connection = self.connection
        raw = connection.connection
        if raw is not self.raw:  # a new connection: the server's defaults
            self._gone_back()
            self._forget()
            self.raw = raw
            self.session_sent = self.local_sent = False
        if connection.autocommit:
            timeout = self.session
            if now > self.session_until:
                timeout = self._refresh(sql, raw, now, local=False)
        else:
            if raw.info.transaction_status == _IDLE:
                # this statement begins a transaction: no SET LOCAL of it yet
                self.local, self.local_until = None, _NEVER
            if now <= self.local_until:
                timeout = self.local
            elif now <= self.session_until:
                timeout = self.session
            else:
                timeout = self._refresh(sql, raw, now, local=True)
        try:
            return execute(sql, params, many, context)
        except Exception as exc:
            if (
                timeout is not None
                and _timed_out(exc)
                and rule.cut_by_cap(timeout, clock.monotonic() - now)
            ):
                raise self._cut(sql, "statement_timeout, lock_timeout") from exc
            raise

    def _refresh(self, sql: Any, raw: Any, now: float, *, local: bool) -> int | None:
        """Send the timeout a statement starting ``now`` is given (``local``: the
        transaction's); ``None`` when none is sent (a session's behind PgBouncer)."""
        timeout = rule.timeout_ms(self.deadline - now)
        if timeout is None:
            raise self._cut(sql, "not sent: the deadline had passed")
        if not local and self.local_only:
            return None  # a session's setting would outlive this statement
        self._send(raw, timeout, local=local)
        until = rule.last_start(timeout, self.deadline)
        if local:
            self.local, self.local_until = timeout, until
            self.local_sent = True
        else:
            self.session, self.session_until = timeout, until
            self.session_sent = True
        return timeout

    def _forget(self) -> None:
        """Nothing sent is known to be in force."""
        self.session = self.local = None
        self.session_until = self.local_until = _NEVER

    def _send(self, raw: Any, timeout: int, *, local: bool) -> None:
        connection = self.connection
        value = str(timeout)
        with connection.wrap_database_errors, raw.cursor() as cursor:
            cursor.execute(_SET, [timeout, value, local, timeout, value, local])

    def _reset(self) -> None:
        """The session's defaults back on this connection (raises what the driver does)."""
        connection = self.connection
        raw = connection.connection
        if raw is not None and raw is self.raw:
            with connection.wrap_database_errors, raw.cursor() as cursor:
                cursor.execute(_RESET)
        self._forget()
        self.session_sent = self.local_sent = False

    def _gone_back(self) -> None:
        """The connection a session's setting was sent on is no longer this alias's: the
        body closed it. With Django's pool that gave it back with the setting in force
        (``connection.close()``, ``close_old_connections()``): the pool is drained, so it
        is closed rather than lent to the next borrower (one that borrowed it meanwhile,
        another thread of the worker, closes it when it gives it back)."""
        if self.raw is None or not self.session_sent:
            return
        self.session_sent = False
        if self.pooled:
            try:
                self.connection.pool.drain()
            except Exception:  # a pool already closed holds nothing to drain
                logger.debug("database %s: its pool not drained", self.alias, exc_info=True)

    def _may_be_in_force(self) -> bool:
        """Whether a setting sent on this connection may still be in force: the session's,
        or the transaction's while that transaction is open (an aborted one's goes with
        its rollback, and a RESET would fail there)."""
        raw = self.connection.connection
        if raw is None or raw is not self.raw:
            return False
        if self.session_sent:
            return True
        return self.local_sent and raw.info.transaction_status not in (_IDLE, _INERROR)

    def restore(self) -> None:
        """The connection as it was before the attempt: its settings reset, the progress
        handler removed; closed if that fails (the next statement reconnects)."""
        connection = self.connection
        try:
            if self.kind == "sqlite":
                raw = connection.connection
                if raw is not None and raw is self.raw:
                    raw.set_progress_handler(None, 0)
            elif self._may_be_in_force():
                # a transaction's still open: the caller's statements after the body's (an
                # eager run in the caller's transaction) must not keep it
                self._reset()
            elif connection.connection is not self.raw:
                self._gone_back()
        except Exception:  # a connection that cannot be reset is dropped
            logger.warning(
                "database %s: the deadline's timeouts could not be reset; the connection is closed",
                self.alias,
                exc_info=True,
            )
            raw = connection.connection
            with contextlib.suppress(Exception):
                # closed before Django's close, which gives a pooled connection back:
                # the pool discards a closed one instead of lending it with the timeouts
                if raw is not None:
                    raw.close()
                connection.close()
        self.raw = None

    def pull_in(self, anchor: Anchor) -> None:
        """A cancel pulled the attempt's deadline in to ``anchor``'s (told from the
        heartbeat's thread): the timeouts sent no longer hold, the next statement is
        given what the new deadline leaves (nothing: cut before it is sent), and SQLite's
        running one is stopped at it. A PostgreSQL statement already running keeps the
        timeout it was sent with."""
        deadline = anchor.deadline_monotonic()
        if deadline >= self.deadline:
            return  # a cancel never lengthens a deadline
        self.anchor, self.deadline = anchor, deadline
        self.session_until = self.local_until = _NEVER
        self.cut_at = min(self.cut_at, deadline)

    def _cut(self, sql: Any, how: str) -> QueryCut:
        anchor = self.anchor
        return QueryCut(
            Gate.DATABASE.value,
            Reason.DEADLINE_PASSED.value,
            anchor.deadline.isoformat(),
            clock.get_clock().now().isoformat(),
            rule.cut_detail(sql, self.alias, how),
        )


def _timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` (Django's error, the driver's its cause) is PostgreSQL's timeout."""
    cause = exc.__cause__ or exc
    state = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    return state in _TIMEOUT_STATES


#: Statements that end a transaction or a savepoint, or set the session, by their first
#: three letters (one set lookup a statement): never capped, never refused (_control).
_CONTROL: Final = frozenset(
    {"ROL", "COM", "END", "ABO", "BEG", "STA", "SAV", "REL", "RES", "DIS", "SET"}
)


def _resets(sql: str) -> bool:
    """Whether the settings sent may no longer be in force after ``sql`` (a rollback to a
    savepoint undoes a SET made since; the body's own SET of a timeout, RESET or DISCARD
    replaces it; a SET of anything else changes nothing of the cap's)."""
    head = sql.lstrip()[:8].upper()
    if head.startswith("SET"):
        return "TIMEOUT" in sql.upper()
    return head.startswith(("ROLLBACK", "RESET", "DISCARD"))


@contextlib.contextmanager
def _capped(app: Any, anchor: Anchor) -> Iterator[None]:
    setting = settings_for(app).get(DATABASE_CAP)
    if setting is False:
        yield
        return
    from django.db import connections

    caps = [
        _Cap(alias, connections[alias], anchor) for alias in rule.chosen(setting, list(connections))
    ]
    for cap in caps:
        cap.connection.execute_wrappers.append(cap)
    _caps_of[id(anchor)] = caps
    try:
        yield
    finally:
        _caps_of.pop(id(anchor), None)
        for cap in caps:
            wrappers = cap.connection.execute_wrappers
            if cap in wrappers:
                wrappers.remove(cap)
            cap.restore()


_NOTHING: Final = contextlib.nullcontext()

#: The caps of each body running now, by its attempt's anchor (its id): what a cancel
#: learnt at a renewal pulls in (:func:`pull_in`).
_caps_of: dict[int, list[_Cap]] = {}


def pull_in(was: Anchor, anchor: Anchor) -> None:
    """The attempt anchored by ``was`` had its deadline pulled in to ``anchor``'s (a
    cancel, learnt at a lease renewal): its body's queries are cut by the new one."""
    for cap in _caps_of.get(id(was), ()):
        cap.pull_in(anchor)


def capped(app: Any, anchor: Anchor | None) -> contextlib.AbstractContextManager[None]:
    """The body's queries capped by ``anchor``'s deadline while inside (nothing without
    a deadline, or with ``deadlines_database_cap = False``)."""
    if anchor is None:
        return _NOTHING
    return _capped(app, anchor)
