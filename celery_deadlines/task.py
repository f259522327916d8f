"""``DeadlineTask``: Celery's hooks, where the enqueue, attempt and retry gates are kept.

The claim gate and the time-limit cap run in the worker's main process, in
:class:`celery_deadlines.core.request.DeadlineRequest`; what a body may call is in
:mod:`celery_deadlines.core.body`; a task's durations come from
:mod:`celery_deadlines.core.options`.
Here the hooks gather the inputs (settings, headers, the clock), ask the pure rules
(:mod:`~celery_deadlines.rules.gates`, :mod:`~celery_deadlines.rules.outcomes`), call the ledger
(:mod:`celery_deadlines.ledger.api`, lazily) and turn refusals into Celery's outcomes:

* enqueue: :class:`DeadlineRefused` raised from ``apply_async``; nothing is published;
* attempt: the refusal is stored as the task's failure, then ``Ignore`` (body not run);
* retry: :class:`DeadlineRefused` raised from ``retry()``, so the run fails with
  ``retry_budget_exhausted`` instead of publishing a retry that would die unseen.

With the Django app installed the run ledger is the admission gate too: ``apply_async``
records the run before publishing, ``before_start`` claims it (a lost claim, a duplicate
delivery, runs nothing: ``Ignore``), and ``__call__`` (which only a process where a ledger
can be on has: :func:`graft_call_onto_deadline_task`) writes the outcome under the claim's
fencing token. A stale attempt's refused write (:class:`StaleLease`) also
becomes ``Ignore``: it must not store a result over the current owner's.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Retry

from . import ledger
from .conf import settings_for
from .core import finishing, options, propagation, publishing, retrying, starting, timelimits
from .core.body import AttemptAPI, end_unresolved
from .core.propagation import HANDED, NOTHING_KEPT, attempt_state
from .errors import ConfigurationError, DeadlineRefused, DispatchRefused, PlanRefused
from .install import install
from .rules import gates, wire
from .rules.budgets import UNSET

#: Whether :class:`DeadlineTask` has its ``__call__`` (:func:`graft_call_onto_deadline_task`),
#: and ``before_start`` hands each attempt to it.
_attempts_handed = False

#: The refusals a run may end with (see ``DeadlineTask.throws``).
EXPECTED: tuple[type[Exception], ...] = (DeadlineRefused, PlanRefused, DispatchRefused)


class DeadlineTask(AttemptAPI, Task):  # type: ignore[type-arg]
    """A Celery task that honours one deadline, stamped once and inherited everywhere.

    Task options (``@app.task(base=DeadlineTask, ...)``), each overriding the task's
    time contract (``deadlines_contracts``) and the settings:

    ``budget``
        seconds or a ``timedelta`` from the first publish; ``None``: no deadline
    ``delivery_budget``
        the same for the delivery deadline
    ``reserve``
        least time that must be left for the task to start
    ``attempt_timeout``
        what one attempt may take, reserved by the retry gate (default: ``time_limit``,
        then the setting)
    ``lease_ttl``
        how long a claim owns the run before it must be renewed (Django tier; default:
        the ``deadlines_lease_ttl`` setting)
    ``deadline_kind``
        ``"execution"`` (default) or ``"delivery"``: a delivery task (a notification)
        published from a run is governed by that run's *delivery* deadline, so it may run
        after execution expired, and is refused with ``delivery_expired`` after it
    ``reconcilers``
        ``{effect name: function}``: who is asked about an effect whose outcome is unknown
    ``cancel_terminates``
        ``True``: a cancel (``celery_deadlines.cancel``) terminates the body when its
        attempt learns it, at its next lease renewal (Celery's ``terminate``), never in
        the middle of an effect's dispatch; on the prefork, threads and solo pools
        (docs/howto/cancel.md). ``False`` (default): the body stops when it looks at
        ``remaining()``

    Call options (``apply_async(budget=...)``): ``budget`` or ``deadline`` (an aware
    datetime), ``delivery_budget`` or ``delivery_deadline``. Every other option, and
    every method not listed here, is ``celery.Task``'s, unchanged.

    A bad option raises :class:`~celery_deadlines.InvalidDeadline` when the task is
    published (and ``manage.py check`` reports it first).
    """

    Request = "celery_deadlines.core.request:DeadlineRequest"
    #: Celery's strategy, with the envelope's rule behind it: a message Celery cannot
    #: make a request of is refused (``invalid_message``), its error never the worker's
    Strategy = "celery_deadlines.core.request:strategy"

    budget: ClassVar[object] = UNSET
    delivery_budget: ClassVar[object] = UNSET
    reserve: ClassVar[object] = UNSET
    attempt_timeout: ClassVar[object] = UNSET
    lease_ttl: ClassVar[object] = UNSET
    deadline_kind: ClassVar[str] = "execution"
    #: ``{effect name: reconciler}``, as a task option (or register with ``@task.reconciler``)
    reconcilers: ClassVar[dict[str, Any]] = {}
    #: a cancel terminates the body at once, when its attempt learns it (never in the
    #: middle of an effect's dispatch): ``core.cancelling.TerminatedByCancel``
    cancel_terminates: ClassVar[bool] = False

    #: Exceptions a refusal ends a run with: expected outcomes, logged once by this library
    #: at WARNING with their reason, not as Celery's ERROR with a traceback. A task's own
    #: ``throws`` (the task option) is added to these, not put in their place.
    throws: tuple[type[Exception], ...] = EXPECTED

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("throws")
        if own is not None and not set(EXPECTED) <= set(own):
            cls.throws = (*EXPECTED, *own)

    @classmethod
    def bind(cls, app: Any) -> Any:
        install()  # the publish hook that stamps children; idempotent
        unset = timelimits.unset_limits(cls)
        bound = super().bind(app)
        # Celery 5.7 copies the app's task_time_limit onto a task that declares none:
        # the pool's default, not the task's own (the attempt timeout, the limits' record)
        timelimits.note_app_copies(cls, unset, app.conf)
        return bound

    # -- durations (one precedence rule: options.resolve) --------------------------------

    def _reserve_duration(self) -> timedelta:
        """The reserve: least time left for this task to start."""
        return options.times(self, settings_for(self.app)).duration("reserve")

    def lease_duration(self) -> timedelta:
        """How long a claim owns the run before it must be renewed."""
        return options.duration(self, "lease_ttl", settings_for(self.app))

    def _attempt_duration(self) -> timedelta:
        """What one attempt may take (reserved by the retry gate)."""
        return options.duration(self, "attempt_timeout", settings_for(self.app))

    def _kind_of(self, decision: gates.Decision) -> gates.Decision:
        """The decision in this task's terms (a delivery task's deadline is its delivery)."""
        return gates.as_delivery(decision) if self.deadline_kind == "delivery" else decision

    # -- enqueue gate ------------------------------------------------------------------------

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **call: Any,
    ) -> Any:
        """Publish with the governing deadline, or raise :class:`DeadlineRefused`.

        Raises :class:`InvalidDeadline` for bad call options (naive datetime, negative
        or absurd budget, both ``budget`` and ``deadline``), :class:`ReservedHeader` for
        a header that would replace a field of Celery's own message (``id``, ``task``,
        ...) and :class:`ConfigurationError` for a bad setting. Either way nothing is
        published.
        """
        sent = publishing.CeleryCall(
            args, kwargs, task_id, producer, link, link_error, shadow, call
        )
        return publishing.publish(self, super().apply_async, sent)

    # -- attempt gate (runs in the pool process, right before the body) ------------------

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        """The attempt gate (and, with the ledger, the claim), which Celery's tracer runs
        right before it calls the task for the body. In a process where a ledger can be
        on (:func:`graft_call_onto_deadline_task`), what it keeps is handed to that call
        (:data:`propagation.HANDED`); in any other, no ledger is asked, and a message
        with no header of its own is read no further."""
        request = propagation.pushed_request(self)
        if _attempts_handed:
            HANDED.state = starting.start(self, request, self._with_ledger()) or NOTHING_KEPT
            return
        headers = request.headers
        if headers is None:
            return  # no header of the caller's: no deadline
        if type(headers) is dict:  # as starting.start without the ledger, inline: every message
            raw = headers.get(wire.DEADLINE_HEADER)
            if type(raw) is float:
                if starting.start_in_seconds(self, request, headers, raw) is None:
                    starting.start_in_full(self, request, headers, False)  # not clearly in time
                return
        starting.start(self, request, False)

    # -- the body, and its outcome written under the claim's token ------------------------

    # ``__call__`` is this method, set on the class by :func:`graft_call_onto_deadline_task`
    # where a ledger can be on, and only there: Celery's tracer calls a task's
    # ``__call__`` instead of its ``run`` whenever its class defines one, and defined
    # here it cost the header tier's pool process 4,100 instructions a message (+1.8 %:
    # bench/worker_instructions.py --side child, 2026-12-05), with nothing for it to do.
    def _call_body(self, *args: Any, **kwargs: Any) -> Any:
        """The task's ``__call__`` where a ledger can be on: the body of the attempt
        :meth:`before_start` handed over, and its outcome written under the claim's
        token; a direct call (no attempt handed over) as Celery's."""
        handed = HANDED.state
        if handed is None:
            # a direct call (from a body, or outside a worker): Celery's, as celery.Task
            return super().__call__(*args, **kwargs)
        HANDED.state = None  # taken: a call from the body is a direct one
        return finishing.run_body(self, handed, args, kwargs)

    # -- retry gate ------------------------------------------------------------------------

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: Exception | None = None,
        throw: bool = True,
        eta: datetime | None = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **call: Any,
    ) -> Any:
        """``Task.retry``, refused with ``retry_budget_exhausted`` when it cannot finish.

        The rule: ``countdown + attempt_timeout + clock_skew_allowance <= remaining``
        (autoretry's backoff and jitter arrive here as ``countdown``). A refused retry
        raises :class:`DeadlineRefused`, chained to ``exc``, so the run fails with that
        reason. The retried message keeps the original absolute deadline. Celery's
        ``max_retries`` (its default of 3 included) still bounds the retries: the
        deadline only ends them sooner (``max_retries=None``: until the deadline).
        """
        state = attempt_state(self)
        attempt = state.attempt if state is not None else None
        if attempt is not None and attempt.unresolved:
            end_unresolved(attempt, exc, task=self)  # never retry blindly after an ambiguous call
        anchor = state.anchor if state is not None else None
        if anchor is not None and not retrying.retries_exhausted(self, max_retries):
            retrying.admit_retry(self, anchor, eta, countdown, exc)
        if state is None:
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **call)
        state.retrying = True  # the publish Celery makes next is this attempt's retry
        try:
            retried = super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **call)
        except Retry as raised:
            retrying.hand_to_eager_retry(self, state.attempt, raised, raised=True)
            raise
        finally:
            state.retrying = False
        retrying.hand_to_eager_retry(self, state.attempt, retried, raised=False)
        return retried

    def _with_ledger(self) -> bool:
        """Is this run recorded in the ledger? The Django app is on (or a test installed
        the in-memory ledger), eager runs (``apply()``, ``task_always_eager``) too."""
        return ledger.enabled_for(self.app)

    # -- eager runs (``apply()``: the caller runs the task inline) -------------------------

    def apply(self, args: Any = None, kwargs: Any = None, *more: Any, **options: Any) -> Any:
        """Celery's ``apply()``: the task run here, inline (``task_always_eager``'s
        ``delay()`` comes here too). With the ledger on it is a run as a worker's is:
        recorded, claimed, its effects performed once per key, its outcome written;
        its ledger statements go where :func:`celery_deadlines.ledger.api.eager_run`
        says (its own connection, or, on SQLite inside a transaction, Django's)."""
        if not ledger.enabled_for(self.app):
            return super().apply(args, kwargs, *more, **options)
        throw = options.get("throw", more[4] if len(more) > 4 else None)
        raising = retrying.EAGER_RUNS.raising
        raising.append(bool(self.app.conf.task_eager_propagates if throw is None else throw))
        try:
            with ledger.api_for(self.app).eager_run(self.app):
                return super().apply(args, kwargs, *more, **options)
        finally:
            raising.pop()


def graft_call_onto_deadline_task() -> None:
    """Give :class:`DeadlineTask` its ``__call__`` (once): every tracer Celery builds
    from then on calls the task for the body, right after ``before_start``, which hands
    it the attempt (the ledger's claim), and the body's outcome is written under the
    claim's token.

    Called where a ledger can turn on: the Django app's ``ready()``, and the import of
    :mod:`celery_deadlines.testing`, whose in-memory ledger a test installs. In a
    process where neither happened no ledger can be on: Celery's tracer calls the
    task's ``run`` itself, as it does a ``celery.Task``'s, and ``before_start`` asks no
    ledger (both at every message).

    Raises :class:`ConfigurationError` when a worker of this process already built a
    DeadlineTask's tracer: that tracer would never call ``__call__``, and a claimed run
    would have no outcome written (Django set up after the worker started, or the
    testing module imported after a test's worker started)."""
    global _attempts_handed
    if _attempts_handed:
        return
    from celery._state import _get_active_apps  # type: ignore[attr-defined]  # every app of the process

    built = sorted(
        name
        for app in _get_active_apps()
        if app.finalized
        for name, task in app._tasks.items()
        if isinstance(task, DeadlineTask) and task.__trace__ is not None
    )
    if built:
        raise ConfigurationError(
            f"a worker built the tracers of {', '.join(built)} before a ledger could turn "
            "on (the Django app 'celery_deadlines' became ready, or celery_deadlines."
            "testing was imported, after the worker started): a claimed run's outcome "
            "would never be written. Set up Django (or import celery_deadlines.testing) "
            "before the worker starts; Celery's Django fixup does, when "
            "DJANGO_SETTINGS_MODULE is set before the Celery app is made."
        )
    # set here, not defined in the class's body: see DeadlineTask._call_body
    type.__setattr__(DeadlineTask, "__call__", DeadlineTask._call_body)
    _attempts_handed = True


__all__ = ["DeadlineTask", "graft_call_onto_deadline_task"]
