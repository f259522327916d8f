"""The retry gate: a retry that cannot finish before the deadline is refused.

``DeadlineTask.retry`` comes here (:func:`admit_retry`) before Celery publishes the retry:
the rule is ``countdown + attempt_timeout + clock_skew_allowance <= remaining``
(:func:`~celery_deadlines.rules.gates.allow_retry`; autoretry's backoff and jitter arrive
as ``countdown``). A refused retry raises :class:`DeadlineRefused`, chained to the
body's error, so the run fails with ``retry_budget_exhausted`` instead of publishing a
retry that would die unseen. With the ledger, the retried message's publish hands the
run to it (:func:`celery_deadlines.core.recording.retrying`); an eager retry, which
publishes nothing, is handed the run here (:func:`hand_to_eager_retry`).
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery.exceptions import Retry

from .. import conf
from ..clock import get_clock
from ..conf import settings_for
from ..rules import gates
from ..rules.budgets import Anchor
from ..rules.quoting import shown
from . import recording
from .finishing import end_after_body
from .refusals import report_refusal

if TYPE_CHECKING:
    from ..ledger.attempt import Attempt


class EagerRuns(threading.local):
    """The eager runs (``apply()``) this thread is in, innermost last: whether each
    raises its body's error to its caller (``throw``, by default the app's
    ``task_eager_propagates``), as Celery's tracer then does with a retry too."""

    def __init__(self) -> None:
        self.raising: list[bool] = []


#: Kept by ``DeadlineTask.apply``, read by :func:`hand_to_eager_retry`.
EAGER_RUNS = EagerRuns()


def admit_retry(
    task: Any, anchor: Anchor, eta: datetime | None, countdown: float | None, exc: Exception | None
) -> None:
    """Raise the retry gate's refusal (chained to ``exc``) of a retry after ``countdown``
    or at ``eta`` of the attempt whose budget is ``anchor``'s; return if it may go."""
    installed = get_clock()
    now = installed.now()
    wait = gates.retry_wait(eta, countdown, task.default_retry_delay, now)
    decision = gates.allow_retry(
        anchor.deadline,
        now,
        remaining=anchor.remaining(installed.monotonic()),
        countdown=wait,
        attempt_timeout=task._attempt_duration(),
        skew_allowance=settings_for(task.app).get(conf.CLOCK_SKEW_ALLOWANCE),
        reserve=task._reserve_duration(),
    )
    if decision.allowed:
        return
    if exc is not None:
        decision = decision._replace(detail=f"{decision.detail}; last error {shown(exc, 500)}")
    report_refusal(task, task.request.id, task.name, decision)
    raise decision.refusal() from exc


def retries_exhausted(task: Any, max_retries: int | None) -> bool:
    """Whether Celery's ``max_retries`` (the call's, else the task's) ends the retries
    anyway: the gate has nothing to add then."""
    limit = task.max_retries if max_retries is None else max_retries
    return limit is not None and task.request.retries + 1 > limit


def hand_to_eager_retry(task: Any, attempt: Attempt | None, retry: object, *, raised: bool) -> None:
    """An eager retry (``apply()`` runs it in place) is handed the run
    (:func:`recording.hand_to_eager_retry`), unless Celery raises it to the caller
    instead and runs none (``raised`` by an eager run that propagates its errors:
    ``task_eager_propagates``): the attempt then ends with it, as with any error
    its caller is given."""
    if (
        raised
        and attempt is not None
        and isinstance(retry, Retry)
        and getattr(retry, "is_eager", False)
        and EAGER_RUNS.raising
        and EAGER_RUNS.raising[-1]
    ):
        end_after_body(attempt, retry, task=task)
        return
    recording.hand_to_eager_retry(task, attempt, retry)
