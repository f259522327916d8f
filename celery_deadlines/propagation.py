"""How a deadline reaches every message: inheritance, scopes and the publish hook.

A message published while a task runs inherits that task's deadlines (retries
included: the retried message is published from inside the attempt). A
:func:`deadline_scope` gives code outside a worker the same thing, so a group or chord
started from a web view shares *one* deadline computed once. The ``before_task_publish``
receiver stamps messages that did not go through :meth:`DeadlineTask.apply_async`
(plain tasks sent from a deadline task, ``app.send_task`` by name, Celery's own
``chord_unlock``...) and sets Celery's ``expires`` header to the governing deadline.

Receivers of ``before_task_publish`` cannot refuse a publish (Celery logs and swallows
their exceptions), so the enqueue gate lives in :meth:`DeadlineTask.apply_async`; a
message stamped here is gated when a worker claims it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final
from weakref import WeakKeyDictionary

from celery import _state as celery_state
from celery import current_app

from .clock import get_clock
from .conf import settings_for
from .errors import InvalidDeadline
from .rules import wire
from .rules.budgets import Anchor, DurationLike, Governed, govern
from .rules.stamping import (
    CALL_OPTIONS,
    NOTHING,
    Inherited,
    delivery_deadline,
    earlier,
    own_deadlines,
    own_instant,
    read_headers,
    stamp_for,
    write,
)

if TYPE_CHECKING:
    from .ledger.attempt import Attempt

logger = logging.getLogger("celery_deadlines")


@dataclass(eq=False)
class AttemptState:
    """What DeadlineTask keeps about the attempt running in this process, as one object
    kept beside the request (:func:`begin`, :func:`state_of`), never on it: the deadlines
    the message carried, the budget's anchor on the monotonic clock, the ledger's claim,
    and whether the body is running. (Celery copies a request's attributes into its
    ``headers`` when it pushes another, and ``retry()`` publishes those headers.)"""

    carried: Inherited
    anchor: Anchor | None = None
    #: the ledger's :class:`~celery_deadlines.ledger.attempt.Attempt`, with the ledger
    attempt: Attempt | None = None
    in_body: bool = False
    #: set by ``retry()`` while Celery publishes the retry of this attempt
    retrying: bool = False


#: Each attempt's state, by the request Celery pushed for it (forgotten with the request).
#: A state must never refer to its request, or the request would never be forgotten.
_states: WeakKeyDictionary[Any, AttemptState] = WeakKeyDictionary()


def begin(request: Any, carried: Inherited) -> AttemptState:
    """The state of the attempt that starts on ``request`` (``before_start``)."""
    state = _states[request] = AttemptState(carried)
    return state


def state_of(request: Any) -> AttemptState | None:
    """The state of the attempt that started on ``request`` itself, if any."""
    if request is None:
        return None
    try:
        return _states.get(request)
    except TypeError:  # not a request Celery made (it cannot be referred to weakly)
        return None


def attempt_state(task: Any) -> AttemptState | None:
    """The state of the attempt ``task`` is running in this thread, if any: its own
    request's, or, in a direct call of the task from its body (Celery pushes a copy of
    the request), the state of the attempt the call runs in."""
    for request in reversed(task.request_stack.stack):
        state = state_of(request)
        if state is not None:
            return state
    return None


def headers_of(request: Any) -> MutableMapping[str, Any]:
    """A request's headers, where its deadlines are. Celery keeps whatever the caller
    gave (``apply(headers=123)``); what is not a mapping carries no deadline."""
    headers = request.headers
    if type(headers) is dict:  # as Celery makes them (checked first: ABCs are slow)
        return headers
    if headers is None:  # a message with no header of its own
        return {}
    if isinstance(headers, MutableMapping):
        return headers
    return dict(headers) if isinstance(headers, Mapping) else {}


_scope: ContextVar[Inherited | None] = ContextVar("celery_deadlines_scope", default=None)


@contextmanager
def deadline_scope(
    *,
    budget: DurationLike | None = None,
    deadline: datetime | None = None,
    delivery_budget: DurationLike | None = None,
    delivery_deadline: datetime | None = None,
    app: Any = None,
) -> Iterator[Inherited]:
    """Give everything published inside the block one deadline, computed once, here.

    Nested scopes and a running task can only shorten it. Raises
    :class:`InvalidDeadline` for a naive datetime or a bad budget, or when both a
    budget and a deadline are given.
    """
    settings = settings_for(app or current_app)
    now = get_clock().now()
    horizon = settings.max_budget
    own = own_instant(budget, deadline, names=("budget", "deadline"), now=now, horizon=horizon)
    own_delivery = own_instant(
        delivery_budget,
        delivery_deadline,
        names=("delivery_budget", "delivery_deadline"),
        now=now,
        horizon=horizon,
    )
    outer = inherited()
    governed = govern(own, "scope", outer.deadline, outer.source)
    scope = Inherited(
        deadline=governed.deadline,
        delivery=earlier(own_delivery, outer.delivery),
        source=governed.source or "scope",
        origin=outer.origin,
        unreadable=outer.unreadable,
    )
    token = _scope.set(scope)
    try:
        yield scope
    finally:
        _scope.reset(token)


def inherited() -> Inherited:
    """The deadlines a message published right now inherits (scope and running task)."""
    scope = _scope.get()
    parent = _parent()
    if scope is None:
        return parent
    if parent is NOTHING:
        return scope
    governed = govern(scope.deadline, scope.source, parent.deadline, "parent")
    return Inherited(
        deadline=governed.deadline,
        delivery=earlier(scope.delivery, parent.delivery),
        source=governed.source or "parent",
        origin=parent.origin,
        unreadable=parent.unreadable,
    )


#: Celery's stack of running tasks keeps one entry per thread that runs one, in a dict
#: of its own (``celery.utils.threads.Local``); an empty dict means no task runs in any
#: thread (a web process that only publishes), and looking further costs more than the
#: rest of a publish's inheritance. ``None`` where Celery keeps it otherwise.
_RUNNING: Final[dict[Any, Any] | None] = getattr(
    getattr(getattr(celery_state, "_task_stack", None), "_local", None), "__storage__", None
)


def current_task() -> Any:
    """The task running in this thread, as Celery's ``get_current_task()`` tells."""
    if _RUNNING is not None and not _RUNNING:
        return None
    return celery_state.get_current_task()


def _parent() -> Inherited:
    task = current_task()
    if task is None:
        return NOTHING
    request = task.request
    if request.called_directly:
        return NOTHING
    known = attempt_state(task)
    if known is not None:  # set by DeadlineTask.before_start: already parsed
        return known.carried
    headers = headers_of(request)
    if wire.DEADLINE_HEADER not in headers and wire.DELIVERY_DEADLINE_HEADER not in headers:
        return NOTHING
    return read_headers(headers, get_clock().now(), settings_for(task.app).max_budget, request.id)


#: The id of the message :meth:`DeadlineTask.apply_async` is publishing in this context,
#: stamped and clamped already: the one message the publish hook leaves as it is. A
#: header cannot say "stamped" (whoever publishes writes the headers); only this can.
_stamped_here: ContextVar[str | None] = ContextVar("celery_deadlines_stamped", default=None)


@contextmanager
def stamped(task_id: str) -> Iterator[None]:
    """Around Celery's publish of the message ``task_id`` that DeadlineTask stamped: the
    publish hook does not stamp it again."""
    token = _stamped_here.set(task_id)
    try:
        yield
    finally:
        _stamped_here.reset(token)


def on_before_task_publish(
    sender: str | None = None,
    headers: dict[str, Any] | None = None,
    properties: dict[str, Any] | None = None,
    **_: Any,
) -> None:
    """``before_task_publish`` receiver: inherit, stamp, and set ``expires``.

    Every message is clamped to the deadline it inherits, whatever deadline headers its
    publisher wrote (``send_task(headers={"x_deadline": ...})`` cannot outlive its parent);
    an inherited deadline that cannot be read is passed on as it is, so the worker refuses
    the child. Only the message :meth:`DeadlineTask.apply_async` is publishing right now
    (:func:`stamped`) is left as it is: it was clamped there.
    """
    if headers is None:
        return
    here = _stamped_here.get()
    if here is not None and here == headers.get("id"):
        return
    call = properties if properties is not None else {}
    parent = inherited()
    explicit = headers.get(wire.DEADLINE_HEADER)
    if (
        CALL_OPTIONS.isdisjoint(call)
        and explicit is None
        and parent.deadline is None
        and (parent.unreadable is None)
    ):
        if parent.delivery is not None:
            headers[wire.DELIVERY_DEADLINE_HEADER] = wire.encode(
                earlier_delivery(headers, parent.delivery)
            )
        return
    task_id = headers.get("id")
    if parent.unreadable is not None:
        # whatever the child names, it cannot escape a deadline nobody can read
        headers[wire.DEADLINE_HEADER] = parent.unreadable
        headers.pop(wire.SOURCE_HEADER, None)
        return
    now = get_clock().now()
    horizon = settings_for(current_app).max_budget
    try:
        own = own_deadlines(call, headers, now, horizon)
    except InvalidDeadline as exc:
        # A receiver cannot raise to the caller: keep the bad value so the worker
        # refuses the message with invalid_deadline and the caller's result says so.
        logger.error("%s[%s]: unusable deadline at publish: %s", sender, task_id, exc)
        headers[wire.DEADLINE_HEADER] = explicit if explicit is not None else str(exc)
        headers.pop(wire.SOURCE_HEADER, None)
        return
    if own.delivery is None:
        own = own._replace(delivery=delivery_deadline(headers, now, horizon))
    stamp = stamp_for(own, parent, now=now, expires=headers.get("expires"), task_id=task_id)
    if stamp.governed.clamped_from is not None:
        log_clamp(sender, task_id, stamp.governed)
    write(headers, stamp)


def earlier_delivery(headers: Mapping[str, Any], inherited: datetime) -> datetime:
    """The delivery deadline a message keeps: the one its header names if that is
    readable and no later than ``inherited``, else ``inherited`` (a header can only
    shorten it)."""
    raw = headers.get(wire.DELIVERY_DEADLINE_HEADER)
    if raw is None:
        return inherited
    try:  # no horizon past the inherited instant: a later one is refused
        return wire.decode(raw, now=inherited, horizon=_NO_LATER)
    except InvalidDeadline:
        return inherited


_NO_LATER: Final = timedelta(0)


def log_clamp(sender: object, task_id: object, governed: Governed) -> None:
    """Make a clamp visible: an explicit deadline later than the inherited one was cut."""
    assert governed.clamped_from is not None
    assert governed.deadline is not None
    logger.info(
        "%s[%s]: deadline %s clamped to the inherited %s (%s)",
        sender,
        task_id,
        governed.clamped_from.isoformat(),
        governed.deadline.isoformat(),
        governed.source,
    )
