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
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from celery import _state as celery_state
from celery import current_app
from celery.app.task import Context
from celery.utils.threads import Local as _Local

from ..clock import get_clock
from ..conf import settings_for
from ..errors import InvalidDeadline
from ..rules import wire
from ..rules.budgets import Anchor, DurationLike, Governed, govern
from ..rules.stamping import (
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
    from ..ledger.attempt import Attempt

logger = logging.getLogger("celery_deadlines")


class AttemptState:
    """What DeadlineTask keeps about the attempt running in this process, on its request
    (:func:`begin`, :func:`state_of`): the deadlines the message carried, the budget's
    anchor on the monotonic clock, the ledger's claim, and whether a retry of it is
    being published.

    An attempt the gate admitted in epoch seconds (:func:`begin_in_time`) keeps the
    header as it came, with the clocks' readings then: :attr:`carried` and
    :attr:`anchor` are worked out from them when first asked for, as the full gate would
    have, so an attempt whose body asks neither builds no datetime.
    """

    __slots__ = (
        "_anchor",
        "_carried",
        "attempt",
        "deadline",
        "headers",
        "horizon",
        "monotonic",
        "now",
        "retrying",
        "task_id",
    )

    def __init__(
        self,
        carried: Inherited | None,
        headers: MutableMapping[str, Any] | None = None,
        task_id: str | None = None,
        deadline: float = 0.0,
        now: float = 0.0,
        monotonic: float = 0.0,
        horizon: timedelta = timedelta(0),
    ) -> None:
        self._carried = carried
        self._anchor: Anchor | None = None
        #: the ledger's :class:`~celery_deadlines.ledger.attempt.Attempt`, with the ledger
        self.attempt: Attempt | None = None
        #: set by ``retry()`` while Celery publishes the retry of this attempt
        self.retrying = False
        #: of an attempt admitted in epoch seconds: the message's headers and task id, its
        #: deadline header, the wall clock (epoch seconds) and the monotonic clock when it
        #: started, and the horizon its header is read against
        self.headers = headers
        self.task_id = task_id
        self.deadline = deadline
        self.now = now
        self.monotonic = monotonic
        self.horizon = horizon

    @property
    def carried(self) -> Inherited:
        """The deadlines the message carried (or the ledger's, if it said earlier)."""
        carried = self._carried
        if carried is None:
            started = datetime.fromtimestamp(self.now, UTC)
            assert self.headers is not None  # kept by begin_in_time, the only one without
            carried = self._carried = read_headers(
                self.headers, started, self.horizon, self.task_id
            )
        return carried

    @carried.setter
    def carried(self, carried: Inherited) -> None:
        self._carried = carried

    @property
    def anchor(self) -> Anchor | None:
        """The attempt's budget on the monotonic clock, ``None`` without a deadline."""
        anchor = self._anchor
        if anchor is None and self.headers is not None:
            deadline = datetime.fromtimestamp(self.deadline, UTC)
            started = datetime.fromtimestamp(self.now, UTC)
            anchor = self._anchor = Anchor(deadline, started, self.monotonic, deadline - started)
        return anchor

    @anchor.setter
    def anchor(self, anchor: Anchor | None) -> None:
        self._anchor = anchor


def pull_in(state: AttemptState, deadline: datetime, monotonic: float) -> None:
    """The ledger's deadline of the running attempt was pulled in (a cancel, learnt at a
    lease renewal, read at ``monotonic``): the attempt's deadline follows it, never
    later than it was and never later than ``monotonic``, so that from then on
    ``remaining()`` is 0 or less, the outbound gate refuses a call, a child inherits
    the earlier deadline (refused at enqueue), and the ledger's writes stop there."""
    anchor = state.anchor
    if anchor is None:
        return  # no deadline kept: the ledger's own refuses every write past it
    pulled = pulled_in(anchor, deadline, monotonic)
    if pulled is None:
        return  # a cancel never lengthens a deadline
    state.anchor = pulled
    state.carried = state.carried._replace(deadline=pulled.deadline)
    if state.attempt is not None:
        state.attempt.deadline_at = state.anchor.deadline_monotonic()


def pulled_in(anchor: Anchor, deadline: datetime, monotonic: float) -> Anchor | None:
    """:func:`pull_in`'s anchor: the attempt's deadline at ``deadline``, or at
    ``monotonic`` if that is earlier; ``None`` when it would not be earlier than it was."""
    elapsed = timedelta(seconds=monotonic - anchor.started_monotonic)
    budget = min(deadline - anchor.started_at, elapsed)
    if budget >= anchor.budget_at_start:
        return None
    return Anchor(anchor.started_at + budget, anchor.started_at, anchor.started_monotonic, budget)


#: What is handed over (:data:`HANDED`) for an attempt of which nothing is kept: no
#: deadline, no ledger (its request keeps no state).
NOTHING_KEPT: Final = AttemptState(NOTHING)

#: The attribute of Celery's request an attempt's state is kept in: read and written at
#: every message, as cheaply as an attribute is. Celery copies a request's attributes
#: into the request it pushes for a direct call of the task (``task(...)`` in its body:
#: the call runs in the same attempt, and finds its state), and, when the request has
#: no headers of its own, into that request's ``headers``, which ``retry()`` publishes,
#: leaving out the names of ``Context``'s own attributes: so this is made one of them
#: (``None`` on the class, set here once), with a leading underscore, as a private
#: attribute: what enumerates a request's public attributes (Celery's own tests of
#: ``Context`` among them) does not see it.
_STATE: Final = "_celery_deadlines_attempt"
if not hasattr(Context, _STATE):
    setattr(Context, _STATE, None)


def begin(request: Any, carried: Inherited) -> AttemptState:
    """The state of the attempt that starts on ``request`` (the attempt gate)."""
    state = AttemptState(carried)
    setattr(request, _STATE, state)
    return state


def begin_in_time(
    request: Any,
    headers: MutableMapping[str, Any],
    deadline: float,
    now: float,
    monotonic: float,
    horizon: timedelta,
) -> AttemptState:
    """The state of an attempt the gate admitted in epoch seconds: its deadline header
    (``deadline``), and the clocks' readings when it started (``now``, epoch seconds;
    ``monotonic``), kept as they are (:class:`AttemptState`)."""
    # made without AttemptState's __init__ (a call more: this runs for every message
    # with a deadline): each slot set here as __init__ sets it
    state = _new_state(AttemptState)
    state._carried = None
    state._anchor = None
    state.attempt = None
    state.retrying = False
    state.headers = headers
    state.task_id = request.id
    state.deadline = deadline
    state.now = now
    state.monotonic = monotonic
    state.horizon = horizon
    setattr(request, _STATE, state)
    return state


_new_state: Final = object.__new__


def state_of(request: Any) -> AttemptState | None:
    """The state of the attempt ``request`` runs in (its own, or, for the request
    Celery pushed for a direct call from a body, the attempt's that made the call)."""
    state = getattr(request, _STATE, None)
    return state if isinstance(state, AttemptState) else None


def pushed_request(task: Any) -> Any:
    """The request on top of ``task``'s stack in this thread (what ``task.request`` is
    in an attempt: the one Celery's tracer pushed), or ``None``.

    Read from where Celery keeps the thread's stack: the storage of
    :class:`celery.utils.threads.Local` for this thread (``_LocalStack``, Celery's
    default), or the thread's own attributes of a ``threading.local`` stack
    (``USE_FAST_LOCALS``); through Celery's properties it costs more than the rest of an
    attempt's start. Any other stack is asked as Celery asks it."""
    where = _where.get(task)
    if where is None:
        where = _where[task] = _where_kept(task.request_stack)
    storage, ident = where
    if ident is None:
        return storage.top  # a stack of another kind: asked as Celery asks it
    frame = storage.get(ident()) if storage is not None else ident()
    requests = frame.get("stack") if frame is not None else None
    return requests[-1] if requests else None


def _where_kept(stack: Any) -> tuple[Any, Any]:
    """Where ``stack`` keeps each thread's requests, as :func:`pushed_request` reads it:
    ``(storage, ident)`` of a ``Local`` (the thread's frame is ``storage[ident()]``),
    ``(None, thread's dict)`` of a ``threading.local`` stack, ``(stack, None)`` else."""
    # getattr, not ``stack.__dict__``: asking for an object's ``__dict__`` turns its
    # attributes into a dict for good, and every later read of ``_local`` (Celery's push,
    # pop and top, at every message) then costs about 2,000 instructions more
    local = getattr(stack, "_local", None)
    if type(local) is _Local:
        return local.__storage__, local.__ident_func__
    if isinstance(stack, threading.local):
        return None, lambda: stack.__dict__
    return stack, None


#: :func:`_where_kept` of each task's request stack (Celery makes it once, when it binds
#: the task), by task (a task lives as long as its app: kept as long as the process).
_where: dict[Any, tuple[Any, Any]] = {}


class _Handed(threading.local):
    """What the attempt gate kept of the attempt that starts in this thread (its
    :class:`AttemptState`, or :data:`NOTHING_KEPT`), until the body's call takes it (and
    sets it back to ``None``): Celery's tracer calls ``before_start`` and then the task,
    nothing in between, so a call that finds ``None`` here is a direct call (from outside
    a worker, or from a body). A thread's own (a greenlet's, when the pool patches
    threads), as Celery's request stack is; an attribute, not a ``ContextVar``: every
    message sets it twice, and a ``ContextVar`` makes a new context each time."""

    state: AttemptState | None = None


HANDED: Final = _Handed()


def attempt_state(task: Any) -> AttemptState | None:
    """The state of the attempt ``task`` is running in this thread, if any: its own
    request's, or, in a direct call of the task from its body (Celery pushes a copy of
    the request, the state included), the state of the attempt the call runs in. Only
    the top request is asked: an eager run in a body is an attempt of its own, with
    nothing kept when it carries no deadline."""
    return state_of(pushed_request(task))


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

    ``budget`` (seconds or a ``timedelta``) or ``deadline`` (an aware datetime), and
    likewise ``delivery_budget`` or ``delivery_deadline``; with neither, the block
    inherits what is in force (a running task's, an enclosing scope's). Settings are the
    Celery app's (``app``, or the current one). Nested scopes and a running task can
    only shorten it. Yields what the block's publishes inherit (its ``deadline``, an
    aware datetime or ``None``). Raises :class:`InvalidDeadline` for a naive datetime
    or a bad budget, or when both a budget and a deadline are given.
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
    if scope is None and _RUNNING is not None and not _RUNNING:
        return NOTHING  # no scope, and no task runs in any thread (as _parent() says)
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
#: Set around Celery's publish of that message and reset after it (``set``/``reset``,
#: not a context manager: every publish of a DeadlineTask does it).
STAMPED: Final[ContextVar[str | None]] = ContextVar("celery_deadlines_stamped", default=None)


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
    here = STAMPED.get()
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
