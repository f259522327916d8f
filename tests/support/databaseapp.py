"""The ledger app's worker with the database cap's tasks
(tests/integration/core/test_database_cap.py).

Each task reports what it saw from the inside: the time it had left when it began and
when its query came back (``self.remaining()``, the attempt's own reading), the error
the query raised, the server's settings and the backend serving it. A task that starts
a slow query reads its backend first: once the deadline has passed no statement is sent.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from django.db import connections, transaction

from celery_deadlines import DeadlineTask, QueryCut
from tests.support.ledgerapp import app

__all__ = ["app"]

# Celery's Django fixup closes every connection before and after each task unless this
# says how many tasks may reuse one: the next task then runs on the same connection
if "TEST_DB_REUSE_MAX" in os.environ:
    app.conf.CELERY_DB_REUSE_MAX = int(os.environ["TEST_DB_REUSE_MAX"])

#: A SQLite statement that runs for minutes: counting to a billion.
SQLITE_SLOW = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000000) "
    "SELECT count(*) FROM n"
)


def _where(alias: str) -> dict[str, Any]:
    """The process, thread and (PostgreSQL) backend the alias's statements run on."""
    seen: dict[str, Any] = {"pid": os.getpid(), "thread": threading.get_ident()}
    if connections[alias].vendor == "postgresql":
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            seen["backend"] = cursor.fetchone()[0]
    return seen


def _cut(self: DeadlineTask, exc: QueryCut, began: float) -> dict[str, Any]:
    return {
        "cut": str(exc),
        "cause": type(exc.__cause__).__name__ if exc.__cause__ else None,
        "left_at_start": began,
        "left_after": self.remaining(),
    }


@app.task(base=DeadlineTask, bind=True, name="db.slow")
def slow(self: DeadlineTask, alias: str = "default", catch: bool = True) -> dict[str, Any]:
    """A query far longer than the budget: ``pg_sleep(10)``, or SQLite counting."""
    seen = _where(alias)
    began = self.remaining()
    try:
        with connections[alias].cursor() as cursor:
            if connections[alias].vendor == "postgresql":
                cursor.execute("SELECT pg_sleep(10)")
            else:
                cursor.execute(SQLITE_SLOW)
    except QueryCut as exc:
        if not catch:
            raise
        return {**seen, **_cut(self, exc, began)}
    return {**seen, "cut": None, "left_at_start": began, "left_after": self.remaining()}


@app.task(base=DeadlineTask, bind=True, name="db.locked")
def locked(self: DeadlineTask, row: int) -> dict[str, Any]:
    """An update of a row another transaction holds: it waits for the lock."""
    seen = _where("default")
    began = self.remaining()
    try:
        with transaction.atomic(), connections["default"].cursor() as cursor:
            cursor.execute("UPDATE cd_cap_probe SET n = n + 1 WHERE id = %s", [row])
    except QueryCut as exc:
        return {**seen, **_cut(self, exc, began)}
    return {**seen, "cut": None, "left_at_start": began, "left_after": self.remaining()}


@app.task(base=DeadlineTask, bind=True, name="db.quick")
def quick(self: DeadlineTask, queries: int = 1, fail: bool = False) -> dict[str, Any]:
    """A few short queries (each under the cap), then success or an error of the body's."""
    with connections["default"].cursor() as cursor:
        for _ in range(queries):
            cursor.execute("SELECT 1")
    if fail:
        raise ValueError("the body's own error")
    return _where("default")


@app.task(base=DeadlineTask, bind=True, name="db.settings")
def settings(self: DeadlineTask) -> dict[str, Any]:
    """The server's timeouts as the next task on this connection reads them."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        statement = cursor.fetchone()[0]
        cursor.execute("SHOW lock_timeout")
        lock = cursor.fetchone()[0]
    return {**_where("default"), "statement_timeout": statement, "lock_timeout": lock}


@app.task(base=DeadlineTask, bind=True, name="db.effect_write")
def effect_write(self: DeadlineTask, key: str, row: int, not_sent: bool = False) -> None:
    """A side effect whose write waits for a row another transaction holds: the cap cuts
    it inside the effect (``not_sent``: the effect declares a cut write not done, true
    here: the write is one transaction, which the cut rolls back)."""
    declared: tuple[type[BaseException], ...] = (QueryCut,) if not_sent else ()
    with (
        self.effect("db_write", key=key, fingerprint={"key": key}, not_sent=declared),
        transaction.atomic(),
        connections["default"].cursor() as cursor,
    ):
        cursor.execute("UPDATE cd_cap_probe SET n = n + 1 WHERE id = %s", [row])


@app.task(base=DeadlineTask, bind=True, name="db.gives_back")
def gives_back(self: DeadlineTask) -> dict[str, Any]:
    """A short query (the cap sends its setting), then the body closes its connection
    itself (with a pool: gives it back) and makes no other statement."""
    seen = _where("default")
    connections["default"].close()
    return seen


@app.task(base=DeadlineTask, bind=True, name="db.stuck")
def stuck(self: DeadlineTask) -> None:
    """A short query (the cap sends its setting), then a wait past the deadline that
    only the hard time limit ends (gevent's: the wait yields to the hub)."""
    _where("default")
    time.sleep(60)
