"""What DeadlineTask asks of the ledger, in Celery's terms (task, request, options).

Kept apart from ``task.py`` so the plain Celery tier never imports Django: these
functions are only called once :func:`celery_deadlines.ledger.enabled_for` said yes.
Translating outcomes into Celery's ``Ignore``/``Retry`` stays in ``task.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from celery import Task
from celery._state import get_current_worker_task

from .. import conf
from .._crashpoints import hit
from ..conf import settings_for
from ..gates import Reason
from ..skew import ClockReading
from ..states import Status
from ..wire import OCCURRENCE_HEADER
from . import outbox
from .attempt import Attempt, owner_name
from .clockwatch import describe
from .sql.connection import Store
from .sql.rows import ClaimRefused, NewRun

if TYPE_CHECKING:
    from ..task import DeadlineTask

_stores: dict[tuple[str, bool], Store] = {}


def store_for(app: Any, *, dedicated: bool = False) -> Store:
    """The ledger store on the alias the app's settings name.

    ``dedicated``: the worker's store, on a connection of its own (see :class:`Store`);
    otherwise Django's connection, so writes join the caller's transaction.
    """
    key = (settings_for(app).get(conf.DATABASE), dedicated)
    try:
        return _stores[key]
    except KeyError:
        store = _stores[key] = Store(key[0], dedicated=dedicated)
        return store


def publish(
    task: DeadlineTask,
    attempt: Attempt | None,
    args: Any,
    kwargs: Any,
    task_id: str,
    link: Any,
    link_error: Any,
    shadow: str | None,
    options: dict[str, Any],
    deadline: datetime | None,
    delivery: datetime | None,
    available_at: datetime | None,
    send: Any,
) -> Any:
    """Record the run (or its retry), then ``send()`` the message. See :mod:`.outbox`.

    A retry of the attempt running in this process is a fenced write on the run
    (raises :class:`StaleLease` if the attempt lost its lease: nothing is published).
    """
    kept = dict(task._get_exec_options(), **options)  # type: ignore[attr-defined]
    kept.update(link=link, link_error=link_error, shadow=shadow)
    body, content_type, encoding = outbox.encode_message(task.serializer, args, kwargs, kept)
    retries = int(options.get("retries") or 0)
    if attempt is not None and attempt.lease.task_id == task_id:
        attempt.retry(retries, available_at, body, f"retries={retries}")
        hit("retry.reserved", task_id)
        sent = send()
        hit("retry.published", task_id)
        return sent
    parent = get_current_worker_task()
    parent_id = options.get("parent_id") or (parent.request.id if parent else None)
    root_id = options.get("root_id") or (
        (parent.request.root_id or parent.request.id) if parent else None
    )
    run = NewRun(
        task_id=task_id,
        task_name=task.name,
        deadline=deadline,
        delivery_deadline=delivery,
        root_id=root_id or task_id,
        parent_id=parent_id or "",
        retries=retries,
        available_at=available_at,
        message_body=body,
        content_type=content_type,
        content_encoding=encoding,
        **occurrence_fields((options.get("headers") or {}).get(OCCURRENCE_HEADER)),
    )
    sent = outbox.record(store_for(task.app), run, send)
    return sent if sent is not None else task.AsyncResult(task_id)


@dataclass(frozen=True)
class Held:
    """A claim won by a worker whose clock is beyond the skew budget: the run was given
    back unstarted, as CLOCK_UNCERTAIN (or, if that write was refused, left to the
    reconciler: ``recorded`` is False)."""

    reading: ClockReading
    budget: timedelta
    recorded: bool

    def explain(self) -> str:
        return (
            f"clock {describe(self.reading)} from the ledger's clock is beyond the skew "
            f"budget of {self.budget.total_seconds()} s"
        )


def occurrence_fields(header: Any) -> dict[str, Any]:
    """The run's schedule columns from an ``x_deadline_occurrence`` header (or none)."""
    if not isinstance(header, dict):
        return {}
    try:
        not_before: datetime | None = datetime.fromisoformat(str(header.get("at")))
    except ValueError:  # recorded without it; the deadline still governs
        not_before = None
    return {
        "not_before": not_before,
        "schedule": str(header.get("schedule") or "")[:255],
        "schedule_zone": str(header.get("zone") or "")[:64],
        "schedule_local": str(header.get("local") or "")[:32],
    }


def claim(
    task: DeadlineTask, request: Any, deadline: datetime | None, reserve: timedelta
) -> Attempt | ClaimRefused | Held:
    """Claim the run of the message being executed (recording it first if it has no row).

    The claim's round trip is also a clock reading (the database's clock between two
    local ones): with ``deadlines_clock_skew_budget`` set and the reading beyond it, the
    won claim is given back at once as CLOCK_UNCERTAIN (:class:`Held`).
    """
    settings = settings_for(task.app)
    store = store_for(task.app, dedicated=True)
    owner = owner_name(request.hostname)
    ttl = task.lease_duration()
    retries = int(request.retries or 0)
    max_lost = settings.get(conf.MAX_LOST_LEASES)
    outcome = store.runs.claim(
        request.id, retries, owner=owner, ttl=ttl, reserve=reserve, max_lost_leases=max_lost
    )
    if isinstance(outcome, ClaimRefused) and outcome.why == ClaimRefused.MISSING:
        # published without the outbox (by name, or before the app was installed)
        store.runs.enqueue(_run_of_request(task, request, deadline, retries))
        outcome = store.runs.claim(
            request.id, retries, owner=owner, ttl=ttl, reserve=reserve, max_lost_leases=max_lost
        )
    if isinstance(outcome, ClaimRefused):
        return outcome
    budget = settings.get(conf.CLOCK_SKEW_BUDGET)
    if budget is None:  # not measured: no skew budget to hold the run to
        return Attempt(store, outcome, owner, ttl)
    sent, answered = store.last_round_trip()  # the claim statement's own round trip
    reading = ClockReading.between(sent, outcome.database_now, answered)
    if not reading.within(budget):
        held = Held(reading, budget, recorded=False)
        recorded = store.runs.hold(outcome, owner, held.explain())
        return Held(reading, budget, recorded)
    return Attempt(store, outcome, owner, ttl, reading=reading)


def refuse(
    task: Task,  # type: ignore[type-arg]
    task_id: str,
    retries: int,
    status: Status,
    reason: str,
    detail: str,
    deadline: datetime | None,
    *,
    dedicated: bool = True,
) -> bool:
    """A gate refused a message: end its run, unless it already ended or another worker
    owns it. Returns whether this refusal ended the run: only then may the caller store
    the refusal as the task's result (it must not overwrite another attempt's).

    A refusal for the deadline ends a recorded run only if the database clock agrees
    (the deadline, less the task's reserve, has passed by it): a worker whose own clock
    ran ahead must not expire work that is still in time.
    """
    store = store_for(task.app, dedicated=dedicated)
    confirm: timedelta | None = None
    if reason in _DEADLINE_REASONS:
        reserve = getattr(task, "reserve_duration", None)
        confirm = reserve() if callable(reserve) else timedelta(0)
    return store.runs.refuse(
        task_id, task.name, retries, status, reason, detail, deadline, confirm_within=confirm
    )


_DEADLINE_REASONS = frozenset(
    {Reason.DEADLINE_PASSED, Reason.INSUFFICIENT_BUDGET, Reason.DELIVERY_EXPIRED}
)


def _run_of_request(
    task: DeadlineTask, request: Any, deadline: datetime | None, retries: int
) -> NewRun:
    options = {
        "link": request.callbacks,
        "link_error": request.errbacks,
        "chain": request.chain,
        "chord": request.chord,
        "group_id": request.group,
        "group_index": request.group_index,
        "root_id": request.root_id,
        "parent_id": request.parent_id,
        "headers": {
            key: value
            for key, value in (request.headers or {}).items()
            if key.startswith("x_deadline") or key == "expires"
        }
        or None,
        **{
            key: value
            for key, value in (request.delivery_info or {}).items()
            if key in ("exchange", "routing_key", "priority") and value
        },
    }
    options = {key: value for key, value in options.items() if value is not None}
    body, content_type, encoding = outbox.encode_message(
        task.serializer, request.args, request.kwargs, options
    )
    return NewRun(
        task_id=request.id,
        task_name=task.name,
        deadline=deadline,
        delivery_deadline=None,
        root_id=request.root_id or request.id,
        parent_id=request.parent_id or "",
        retries=retries,
        available_at=None,
        message_body=body,
        content_type=content_type,
        content_encoding=encoding,
    )
