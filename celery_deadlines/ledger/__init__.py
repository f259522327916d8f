"""The run ledger: the Django tier's durable record of every DeadlineTask run.

Active when ``"celery_deadlines"`` is in ``INSTALLED_APPS`` (and the app registry is
ready); task code does not change between the tiers. The Celery tier reaches it through
:mod:`.api` (plain values in and out) and :mod:`.operations`; its modules, and a message's
path through them, are mapped once, in DEVELOPERS.md ("The tiers", "The life of a
message").
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..rules.limits import AttemptLimits as _AttemptLimits
    from ..rules.records import ClaimRefused as _ClaimRefused
    from ..rules.records import EndedRun as _EndedRun
    from ..rules.records import Held as _Held
    from ..rules.records import KeptResult as _KeptResult
    from ..rules.records import NewRun as _NewRun
    from ..rules.records import Recorded as _Recorded
    from ..rules.records import Refusal as _Refusal
    from ..rules.states import Status
    from .attempt import Attempt


class LedgerAPI(Protocol):
    """What the Celery tier asks of the ledger: :mod:`celery_deadlines.ledger.api`, or
    the in-memory :class:`celery_deadlines.testing.FakeLedger`. What it takes and
    returns are the plain values of :mod:`celery_deadlines.rules.records`."""

    def encode_message(
        self, serializer: str, args: Any, kwargs: Any, options: dict[str, Any]
    ) -> tuple[bytes, str, str]: ...

    def record_run(self, app: Any, run: _NewRun, *, publisher: Any = None) -> _Recorded: ...

    def publish_failed(self, app: Any, task_id: str, error: BaseException) -> None: ...

    def send_at_commit(self, app: Any, send: Callable[[], None]) -> None: ...

    def eager_run(self, app: Any) -> AbstractContextManager[None]: ...

    def record_eager_run(self, app: Any, run: _NewRun) -> None: ...

    def hand_to_retry(
        self, attempt: Any, *, retries: int, available_at: datetime | None, message_body: bytes
    ) -> None: ...

    def claim_run(
        self,
        app: Any,
        *,
        task_id: str,
        task_name: str,
        retries: int,
        hostname: str | None,
        ttl: timedelta,
        reserve: timedelta,
        unrecorded: Callable[[], _NewRun],
        exclusive: bool = False,
        eager: bool = False,
        limits: _AttemptLimits | None = None,
    ) -> Attempt | _ClaimRefused | _Held: ...

    def refuse_run(
        self,
        app: Any,
        *,
        task_id: str,
        task_name: str,
        retries: int,
        status: Status,
        reason: str,
        detail: str,
        deadline: datetime | None,
        confirm_within: timedelta | None,
    ) -> _Refusal: ...

    def refuse_publish(
        self,
        app: Any,
        *,
        task_id: str,
        task_name: str,
        reason: str,
        detail: str,
        deadline: datetime | None,
    ) -> bool: ...

    def end_owned(
        self,
        app: Any,
        *,
        task_id: str,
        hostname: str | None,
        pid: object,
        status: Status,
        reason: str,
        detail: str,
    ) -> str | None: ...

    def ended_run(self, app: Any, task_id: str) -> _EndedRun | None: ...

    def keep_result(self, app: Any, value: Any) -> _KeptResult | None: ...

    def read_result(self, app: Any, kept: _KeptResult) -> Any: ...

    def tell_caller_unknown(
        self, app: Any, task_id: str, error: str, task_name: str = ""
    ) -> None: ...

    def lapse_owned(
        self, app: Any, task_id: str, hostname: str | None, pid: object, detail: str
    ) -> bool: ...


class _OwnStatements(threading.local):
    """How deep this thread is in the ledger's own statements on the application's
    connection (the producer's store: an outbox row joins the body's transaction). The
    database cap (:mod:`celery_deadlines.core.database`) lets them run uncut: the
    ledger's statements are its own, never the body's."""

    def __init__(self) -> None:
        self.depth = 0


#: read by the database cap, raised by :meth:`celery_deadlines.ledger.sql.connection.Store.execute`
own_statements = _OwnStatements()

_active: bool | None = None
#: Django's app registry, once imported (``None`` before the first question)
_registry: Any = None
#: A ledger installed in place of the database's (``celery_deadlines.testing.use_ledger``).
_installed: Any = None


def enabled_for(app: Any) -> bool:
    """True when ``app``'s DeadlineTask runs are recorded: the Django app is installed
    and ready, and the Celery app did not turn the ledger off (``deadlines_ledger``)."""
    if _installed is not None:
        return True
    if not active():
        return False
    from ..conf import LEDGER, settings_for

    return settings_for(app).get(LEDGER)


def api_for(app: Any) -> LedgerAPI:
    """The ledger's entry point for ``app``: :mod:`celery_deadlines.ledger.api`, or the
    ledger a test installed (:class:`celery_deadlines.testing.FakeLedger`), which keeps
    the same contract in memory."""
    if _installed is not None:
        installed: LedgerAPI = _installed
        return installed
    from . import api

    return api


def install(fake: Any) -> Any:
    """Put ``fake`` in place of the database's ledger (``None`` puts it back); returns
    the one it replaced. For tests: see :func:`celery_deadlines.testing.use_ledger`."""
    global _installed
    previous, _installed = _installed, fake
    return previous


def active() -> bool:
    """True when the Django app is installed and ready: runs are then recorded."""
    global _active, _registry
    if _active is not None:
        return _active  # decided once Django was ready (reset() asks again)
    if _registry is None:
        try:
            from django.apps import apps
        except ImportError:  # the plain Celery tier: Django is not even installed
            _active = False
            return False
        _registry = apps  # imported once: this is asked at every publish until ready
    if not _registry.ready:
        return False  # not decided yet: asked again once Django is set up
    _active = _registry.is_installed("celery_deadlines")
    return _active


def reset() -> None:
    """Decide again on the next call (tests that install or remove the app)."""
    global _active
    _active = None


def clock_watch(app: Any) -> Any:
    """This worker's :class:`~celery_deadlines.ledger.clockwatch.ClockWatch`, when the
    ledger is on and ``deadlines_clock_skew_budget`` is set (main process), else None."""
    if _active is False and _installed is None:
        return None  # the plain Celery tier (asked several times per message: kept short)
    if not enabled_for(app):
        return None
    from .reconcile import running

    reconciler = running()
    return reconciler.watch if reconciler is not None else None
