"""The operator's view of the run ledger, in the Django admin.

Read-only: runs (a compact list; a page with a summary by the database clock, the
timeline, effects, the workflow, the message and the result), effects and their
resolution. The only writes are explicit actions, each behind its own permission, each
one compare-and-swap through :mod:`celery_deadlines.ledger.operations`, each recorded as
a ``LogEntry`` (the History button): **expire now**, **requeue** (only while the
deadline allows) and **resolve** an effect of unknown outcome with evidence. Every
instant shown is UTC to the millisecond with its zone (``Z``).
"""

from __future__ import annotations

from .display import describe_time_left
from .effects import EffectAdmin
from .runs import RunAdmin

__all__ = ["EffectAdmin", "RunAdmin", "describe_time_left"]
