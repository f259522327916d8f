"""The run ledger: the Django tier's durable record of every DeadlineTask run.

Active when ``"celery_deadlines"`` is in ``INSTALLED_APPS`` (and the app registry is
ready); task code does not change between the tiers. The pieces:

``sql``        one SQL dialect per supported database (PostgreSQL, SQLite): the clock
``store``      every write, as one conditional statement against the database clock
``attempt``    a claimed attempt's lease, fenced writes and checkpoints (pool process)
``heartbeat``  lease renewal while a body runs, capped by the deadline
``outbox``     the run row before its message; publish on commit; republish
``reconcile``  restart reconciliation and the outbox sweeper (worker main process)
"""

from __future__ import annotations

from typing import Any

_active: bool | None = None


def enabled_for(app: Any) -> bool:
    """True when ``app``'s DeadlineTask runs are recorded: the Django app is installed
    and ready, and the Celery app did not turn the ledger off (``deadlines_ledger``)."""
    if not active():
        return False
    from ..conf import LEDGER, settings_for

    return settings_for(app).get(LEDGER)


def active() -> bool:
    """True when the Django app is installed and ready: runs are then recorded."""
    global _active
    if _active:
        return True
    try:
        from django.apps import apps
    except ImportError:  # the plain Celery tier: Django is not even installed
        _active = False
        return False
    if not apps.ready:
        return False  # not decided yet: asked again once Django is set up
    _active = apps.is_installed("celery_deadlines")
    return _active


def reset() -> None:
    """Decide again on the next call (tests that install or remove the app)."""
    global _active
    _active = None


def clock_watch(app: Any) -> Any:
    """This worker's :class:`~celery_deadlines.ledger.clockwatch.ClockWatch`, when the
    ledger is on and ``deadlines_clock_skew_budget`` is set (main process), else None."""
    if not enabled_for(app):
        return None
    from .reconcile import running

    reconciler = running()
    return reconciler.watch if reconciler is not None else None
