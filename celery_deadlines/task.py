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
can be on has: :func:`hand_attempts_to_the_body`) writes the outcome under the claim's
fencing token. A stale attempt's refused write (:class:`StaleLease`) also
becomes ``Ignore``: it must not store a result over the current owner's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, MutableMapping
from datetime import datetime, timedelta
from functools import partial
from traceback import format_exception
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from celery import Task
from celery.exceptions import Ignore, Reject, Retry
from celery.utils import uuid

from . import conf, ledger
from .clock import get_clock
from .conf import settings_for
from .core import claiming, options, pools, propagation, recording, seconds, telemetry, timelimits
from .core.body import AttemptAPI, Paused, Unresolved, end_unresolved
from .core.propagation import HANDED, NOTHING_KEPT, STAMPED, attempt_state
from .core.refusals import report_refusal, report_refused_message, tell_refusal
from .errors import (
    ConfigurationError,
    DeadlineRefused,
    DispatchRefused,
    PlanRefused,
    ReservedHeader,
    StaleLease,
)
from .install import install
from .ledger._crashpoints import hit
from .rules import gates, outcomes, stamping, wire
from .rules.budgets import UNSET, Anchor
from .rules.quoting import shown
from .rules.records import ENDED_IT, Expired
from .rules.states import Status

if TYPE_CHECKING:
    from .ledger.attempt import Attempt

logger = logging.getLogger("celery_deadlines")

#: Whether :class:`DeadlineTask` has its ``__call__`` (:func:`hand_attempts_to_the_body`),
#: and ``before_start`` hands each attempt to it.
_attempts_handed = False

#: The refusals a run may end with (see ``DeadlineTask.throws``).
EXPECTED: tuple[type[Exception], ...] = (DeadlineRefused, PlanRefused, DispatchRefused)


class _EagerRuns(threading.local):
    """The eager runs (``apply()``) this thread is in, innermost last: whether each
    raises its body's error to its caller (``throw``, by default the app's
    ``task_eager_propagates``), as Celery's tracer then does with a retry too."""

    def __init__(self) -> None:
        self.raising: list[bool] = []


_eager_runs = _EagerRuns()


class _EndedCancelled(Ignore):
    """A cancelled run's attempt, ended ``cancelled`` and its caller told ``REVOKED``:
    Celery's tracer stores nothing more (an ``Ignore``)."""


class _Told(propagation.AttemptState):
    """An eager call of a run that had ended (:class:`claiming.Ended`), handed to the
    task's call instead of an attempt: the call tells the run's outcome, the body is
    not run."""

    __slots__ = ("ended",)

    def __init__(self, ended: claiming.Ended) -> None:
        super().__init__(stamping.NOTHING)
        self.ended = ended


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
        given = call.get("headers")
        if given:
            refuse_reserved_headers(self.name, given)
        with_ledger = self._with_ledger()
        if not with_ledger:
            stamped = seconds.stamp_own_budget(self, call, task_id)
            if stamped is not None:
                return self._send(
                    stamped, args, kwargs, task_id, producer, link, link_error, shadow, call
                )
        stamp, starts_at = self._stamp(call, task_id, with_ledger)
        if not with_ledger:
            stamped = stamp is not None
            return self._send(
                stamped, args, kwargs, task_id, producer, link, link_error, shadow, call
            )
        assert stamp is not None  # the ledger records every run it publishes
        task_id = task_id or uuid()

        def send() -> Any:
            return self._send(True, args, kwargs, task_id, producer, link, link_error, shadow, call)

        links = {"link": link, "link_error": link_error, "shadow": shadow}
        return recording.publish(
            self,
            args,
            kwargs,
            task_id=task_id,
            call=call,
            links=links,
            stamp=stamp,
            available_at=starts_at,
            send=send,
        )

    def _stamp(
        self, call: dict[str, Any], task_id: str | None, with_ledger: bool
    ) -> tuple[stamping.Stamp | None, datetime | None]:
        """Stamp the publish's headers into ``call`` (taking this package's options out
        of it) and return the stamp and when the message may first start; ``None`` for
        the stamp when there is no deadline anywhere and no ledger (the message is
        Celery's own, and no clock is read). Raises the enqueue gate's refusal."""
        settings = settings_for(self.app)
        times = options.times(self, settings)  # the task's durations, worked out once
        # inline, not a call, on this path of every publish: the same steps as
        # canvas.publish_stamp(), which the workflow gate uses; tests/unit/core/test_canvas.py
        # holds the two equal
        parent = propagation.inherited()
        if parent is stamping.NOTHING and not with_ledger and times.name_nothing(call):
            return None, None
        now = get_clock().now()
        given = call.get("headers")
        headers = dict(given) if given else {}
        if self.deadline_kind == "delivery" and parent is not stamping.NOTHING:
            # a notification lives by the delivery deadline, never by the execution one
            parent = parent._replace(deadline=parent.delivery)
        if parent.unreadable is not None:
            detail = "the parent task's deadline is unreadable"
            self._refuse_enqueue(gates.invalid(gates.Gate.ENQUEUE, now, detail), task_id, None)
        own = options.own_deadlines(self, call, headers, now, times)
        if own is stamping.NO_OWN and parent is stamping.NOTHING and not with_ledger:
            # call options that name no instant (``budget=None``) on a task with no
            # budget, outside any task or scope: nothing to stamp or gate, as above
            return None, None
        # the caller's ``expires``, else the task's (an explicit None clears it, as Celery's
        # own merge of the task's options does)
        expires = call.get("expires", self.expires)
        stamp = stamping.stamp_for(own, parent, now=now, expires=expires, task_id=task_id)
        governed = stamp.governed
        if governed.clamped_from is not None and own.source == "call":
            propagation.log_clamp(self.name, task_id, governed)
        starts_at = options.start_of(call, now)
        if governed.deadline is not None:
            reserve = times.duration("reserve")
            start = now if starts_at is None or starts_at < now else starts_at
            if start > gates.latest_start(governed.deadline, reserve):
                decision = gates.admit(
                    gates.Gate.ENQUEUE, governed.deadline, now, reserve, starts_at=starts_at
                )
                self._refuse_enqueue(decision, task_id, reserve)
        stamp = stamping.for_deadline_task(stamp, expires=expires, starts_at=starts_at)
        stamping.write(headers, stamp)
        if headers:
            call["headers"] = headers
        return stamp, starts_at

    def _send(
        self,
        stamped: bool,
        args: Any,
        kwargs: Any,
        task_id: str | None,
        producer: Any,
        link: Any,
        link_error: Any,
        shadow: str | None,
        call: dict[str, Any],
    ) -> Any:
        """Celery's own publish of the message as :meth:`_stamp` left it: the one way
        into Celery. A ``stamped`` message is published under :data:`propagation.STAMPED`,
        so the publish hook does not stamp it again (its id, Celery's to make otherwise,
        is made here); an unstamped one is judged by the hook like any message."""
        if not stamped:
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **call
            )
        task_id = task_id or uuid()
        token = STAMPED.set(task_id)
        try:
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **call
            )
        finally:
            STAMPED.reset(token)

    def _refuse_enqueue(
        self, decision: gates.Decision, task_id: str | None, reserve: timedelta | None
    ) -> NoReturn:
        """Refuse the publish (``reserve``: the task's, given with a refusal for the
        deadline: see :func:`recording.record_refusal`)."""
        decision = self._kind_of(decision)
        report_refusal(self, task_id, self.name, decision)
        refusal = decision.refusal()
        if self._with_ledger():
            # the refused run is on record too (under a fresh id if the caller gave none)
            recording.record_refusal(
                self.app,
                decision,
                task_name=self.name,
                task_id=task_id or uuid(),
                retries=0,
                reserve=reserve,
                dedicated=False,
            )
        raise refusal

    # -- attempt gate (runs in the pool process, right before the body) ------------------

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        """The attempt gate (and, with the ledger, the claim), which Celery's tracer runs
        right before it calls the task for the body. In a process where a ledger can be
        on (:func:`hand_attempts_to_the_body`), what it keeps is handed to that call
        (:data:`propagation.HANDED`); in any other, no ledger is asked, and a message
        with no header of its own is read no further."""
        request = propagation.pushed_request(self)
        if _attempts_handed:
            HANDED.state = self._start(request, self._with_ledger()) or NOTHING_KEPT
            return
        headers = request.headers
        if headers is None:
            return  # no header of the caller's: no deadline
        if type(headers) is dict:  # as :meth:`_start` without the ledger, inline: every message
            raw = headers.get(wire.DEADLINE_HEADER)
            if type(raw) is float:
                if seconds.start(self, request, headers, raw) is None:
                    self._start_in_full(request, headers, False)  # not clearly in time
                return
        self._start(request, False)

    def _start(self, request: Any, with_ledger: bool) -> propagation.AttemptState | None:
        """Anchor the attempt's budget on the monotonic clock, or refuse to start it (and,
        ``with_ledger``, claim the run); ``None`` when there is nothing to keep: no
        deadline, no ledger (what the body's children inherit is then nothing, and
        nothing is read but the headers: this runs for every message).

        A deadline header as this package writes it (epoch seconds), clearly in time,
        with no ledger and no tracing to tell, is admitted in epoch seconds; every other
        case, the edges included, by :meth:`_start_in_full`."""
        headers = request.headers
        if type(headers) is not dict:  # as Celery makes them (checked first: ABCs are slow)
            headers = propagation.headers_of(request)  # whatever the caller gave Celery
        raw = headers.get(wire.DEADLINE_HEADER)
        if not with_ledger:
            if raw is None and wire.DELIVERY_DEADLINE_HEADER not in headers:
                return None  # nothing to gate, nothing to anchor, no claim, no clock read
            if type(raw) is float:
                state = seconds.start(self, request, headers, raw)
                if state is not None:
                    return state
        return self._start_in_full(request, headers, with_ledger)

    def _start_in_full(
        self, request: Any, headers: MutableMapping[str, Any], with_ledger: bool
    ) -> propagation.AttemptState:
        """:meth:`_start` with datetimes, the ledger's claim and tracing."""
        task_id = request.id
        carries = stamping.carries_deadlines(headers)
        if not carries and not with_ledger:
            # the state alone (what the body's children inherit, and its origin)
            return propagation.begin(request, stamping.carried_nothing(headers, task_id))
        clock = get_clock()
        now = clock.now()
        # read together: the budget is anchored at this instant, whatever the claim takes
        started = clock.monotonic()
        settings = settings_for(self.app)
        times = options.times(self, settings)
        carried = stamping.read_headers(
            headers, now, times.horizon if carries else gates.ZERO, task_id
        )
        state = propagation.begin(request, carried)
        if carried.unreadable is not None:
            detail = f"unreadable deadline header {shown(carried.unreadable)}"
            self._refuse_attempt(gates.invalid(gates.Gate.ATTEMPT, now, detail), task_id, None)
        deadline = carried.deadline
        if deadline is None and not with_ledger:
            return state  # nothing to gate, nothing to anchor, no claim
        reserve = times.duration("reserve")
        # With a clock-skew budget the ledger's clock decides (docs/explanation/run-ledger.md: the
        # clock-skew hold comes before the deadline): the claim measures this clock
        # against it, holds the run if they disagree, and checks the deadline by the
        # database clock.
        skew_budget = settings.get(conf.CLOCK_SKEW_BUDGET) if with_ledger else None
        if (
            deadline is not None
            and skew_budget is None
            and now > gates.latest_start(deadline, reserve)
        ):
            self._refuse_attempt(
                gates.admit(gates.Gate.ATTEMPT, deadline, now, reserve), task_id, reserve
            )
        if with_ledger:
            hit("claim.before", task_id)
            attempt = claiming.claim(
                claiming.Claim(
                    caller=claiming.caller_of(self),
                    sender=self,
                    task_id=task_id,
                    request=request,
                    deadline=deadline,
                    lease=self.lease_duration(),
                    reserve=reserve,
                    serializer=self.serializer,
                    requeue=bool(self.acks_late and not request.is_eager),
                )
            )
            if isinstance(attempt, claiming.NOT_RUN):
                if isinstance(attempt, claiming.Ended):
                    return _Told(attempt)
                self._end_unclaimed(attempt, task_id, reserve)
            hit("claim.after", task_id)
            state.attempt = attempt
            if attempt.lease.deadline is not None and (
                deadline is None or attempt.lease.deadline < deadline
            ):
                # the ledger's deadline is the authority; a header can only shorten it
                deadline = attempt.lease.deadline
                state.carried = carried._replace(deadline=deadline)
            if skew_budget is not None and attempt.reading is not None:
                now = attempt.reading.corrected(now)  # remaining time by the ledger's clock
            attempt.start()
        if deadline is not None:
            state.anchor = Anchor.at(deadline, now, started)
            if state.attempt is not None:
                state.attempt.deadline_at = state.anchor.deadline_monotonic()
                # a cancel learnt at a renewal pulls the attempt's deadline in
                state.attempt.pulled_in = partial(propagation.pull_in, state)
        telemetry.annotate_attempt(
            deadline=deadline,
            now=now,
            headers=headers,
            lease_token=state.attempt.lease.token if state.attempt is not None else None,
        )
        return state

    def _end_unclaimed(
        self,
        not_run: claiming.Refused | claiming.NotRun | claiming.Unreachable,
        task_id: str,
        reserve: timedelta,
    ) -> NoReturn:
        """End a delivery the claim did not run, as its outcome says, in Celery's terms."""
        if isinstance(not_run, claiming.Refused):
            self._refuse_attempt(not_run.decision, task_id, reserve)
        if isinstance(not_run, claiming.Unreachable):
            if not_run.requeue:
                raise Reject(str(not_run.error), requeue=True) from not_run.error
            raise not_run.error
        raise Ignore(not_run.why)

    def _refuse_attempt(
        self, decision: gates.Decision, task_id: str, reserve: timedelta | None
    ) -> NoReturn:
        """Refuse to run this delivery: record it, store the typed refusal as the task's
        failure, or Celery's own expiry (:mod:`celery_deadlines.core.refusals`), unless another
        attempt's result stands, and end it with ``Ignore`` (``reserve``: the task's,
        given with a refusal for the deadline). An eager run's caller waits in this very
        call: the refusal is raised, and Celery raises it to the caller or keeps it in
        the ``EagerResult`` as any eager failure."""
        decision = self._kind_of(decision)
        refusal = decision.refusal()
        request = self.request
        eager = bool(request.is_eager)
        outcome = ENDED_IT  # without the ledger every refusal ends its run
        if self._with_ledger():
            try:
                outcome = recording.record_refusal(
                    self.app,
                    decision,
                    task_name=self.name,
                    task_id=task_id,
                    retries=int(request.retries or 0),
                    reserve=reserve,
                )
            except Exception:
                report_refusal(self, task_id, self.name, decision)
                raise
        # recorded first: a late delivery of a run that had ended is not its refusal again
        report_refused_message(self, self.app, task_id, self.name, decision, outcome)
        if not outcome:
            # already ended, or another attempt owns the run: its result stands
            if eager:
                raise refusal
            raise Ignore(str(refusal))
        if eager:
            raise refusal
        tell_refusal(
            self.backend,
            task_id,
            refusal,
            source=stamping.header_source(propagation.headers_of(request)),
            request=request,
            store_result=claiming.caller_of(self).stores_errors,
        )
        raise Ignore(str(refusal))

    # -- the body, and its outcome written under the claim's token ------------------------

    def _call_body(self, *args: Any, **kwargs: Any) -> Any:
        """The task's ``__call__`` where a ledger can be on (:func:`hand_attempts_to_the_body`):
        the body of the attempt :meth:`before_start` handed over, and its outcome written
        under the claim's token; a direct call (no attempt handed over) as Celery's."""
        handed = HANDED.state
        if handed is None:
            # a direct call (from a body, or outside a worker): Celery's, as celery.Task
            return super().__call__(*args, **kwargs)
        HANDED.state = None  # taken: a call from the body is a direct one
        # Called by Celery's tracer right after before_start, which already pushed the
        # request and the task: the body runs on that request, as Celery runs a
        # celery.Task's (never push twice).
        attempt = handed.attempt
        if attempt is None:
            if type(handed) is _Told:  # an eager call of a run that had ended
                if handed.ended.error is not None:
                    raise handed.ended.error
                return handed.ended.value
            from .core.database import capped  # here: see _run_claimed

            with capped(self.app, handed.anchor):
                return self.run(*args, **kwargs)
        return self._run_claimed(attempt, args, kwargs, handed.anchor)

    def _run_claimed(
        self, attempt: Attempt, args: Any, kwargs: Any, anchor: Anchor | None = None
    ) -> Any:
        """The body of a claimed attempt, and its outcome written under its token. The
        body's queries end by the deadline (``anchor``'s: :mod:`.core.database`)."""
        # imported here, where a body runs with a ledger: a module-level import costs the
        # header tier's main process 0.9 % of its instructions per message (bench/README.md)
        from .core.database import capped

        try:
            try:
                try:
                    with capped(self.app, anchor):
                        result = self.run(*args, **kwargs)
                finally:
                    attempt.stop()  # no renewal may follow the attempt's final write
                if attempt.unresolved:
                    end_unresolved(attempt, task=self)
                if attempt.cancelled:
                    self._end_cancelled(attempt)
                attempt.succeed(self._result_to_keep(result))
                hit("run.completed", self.request.id)
                return result
            except (Retry, StaleLease, Unresolved, Paused, _EndedCancelled):
                raise  # written by apply_async / by nobody (stale) / as UNKNOWN / PAUSED
            except BaseException as exc:
                if pools.stopped_by_the_pool(exc):
                    raise  # the worker writes the run's end at the limit, as prefork's
                if attempt.cancelled and not attempt.unresolved:
                    self._end_cancelled(attempt)
                end_after_body(attempt, exc, task=self)
                raise
        except StaleLease as exc:
            if self.request.is_eager:
                refusal = end_eager_overrun(attempt, task=self)
                if refusal is not None:
                    raise refusal from exc
            logger.warning("%s[%s]: %s; nothing stored", self.name, self.request.id, exc)
            raise Ignore(str(exc)) from exc

    def _end_cancelled(self, attempt: Attempt) -> NoReturn:
        """The end of a body whose run was cancelled while it ran (its renewal found the
        deadline pulled in): ``EXPIRED`` ``cancelled`` whatever the body returned or
        raised, and its caller told Celery's revoke (``REVOKED``), as every run of the
        cancelled tree is. A lease lapsed meanwhile raises :class:`StaleLease`: the
        reconciler ends the run ``cancelled`` then."""
        detail = "cancelled while it ran: its deadline was pulled in"
        attempt.end(Status.EXPIRED, gates.Reason.CANCELLED.value, detail)
        if claiming.caller_of(self).stores_errors:
            self.backend.mark_as_revoked(
                self.request.id, outcomes.CELERY_REVOKED, request=self.request
            )
        raise _EndedCancelled(detail)

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
        if anchor is not None and not self._retries_exhausted(max_retries):
            self._admit_retry(anchor, eta, countdown, exc)
        if state is None:
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **call)
        state.retrying = True  # the publish Celery makes next is this attempt's retry
        try:
            retried = super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **call)
        except Retry as raised:
            self._hand_to_eager_retry(state.attempt, raised, raised=True)
            raise
        finally:
            state.retrying = False
        self._hand_to_eager_retry(state.attempt, retried, raised=False)
        return retried

    def _hand_to_eager_retry(self, attempt: Attempt | None, retry: object, *, raised: bool) -> None:
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
            and _eager_runs.raising
            and _eager_runs.raising[-1]
        ):
            end_after_body(attempt, retry, task=self)
            return
        recording.hand_to_eager_retry(self, attempt, retry)

    def _admit_retry(
        self, anchor: Anchor, eta: datetime | None, countdown: float | None, exc: Exception | None
    ) -> None:
        clock = get_clock()
        now = clock.now()
        wait = gates.retry_wait(eta, countdown, self.default_retry_delay, now)
        decision = gates.allow_retry(
            anchor.deadline,
            now,
            remaining=anchor.remaining(clock.monotonic()),
            countdown=wait,
            attempt_timeout=self._attempt_duration(),
            skew_allowance=settings_for(self.app).get(conf.CLOCK_SKEW_ALLOWANCE),
            reserve=self._reserve_duration(),
        )
        if decision.allowed:
            return
        if exc is not None:
            decision = decision._replace(detail=f"{decision.detail}; last error {shown(exc, 500)}")
        report_refusal(self, self.request.id, self.name, decision)
        raise decision.refusal() from exc

    def _retries_exhausted(self, max_retries: int | None) -> bool:
        limit = self.max_retries if max_retries is None else max_retries
        return limit is not None and self.request.retries + 1 > limit

    # -- helpers -------------------------------------------------------------------------

    def _result_to_keep(self, result: Any) -> Any:
        """The return value the ledger keeps with the run's end, so a redelivery after
        a worker died before Celery stored it tells the caller: nothing when Celery
        would store nothing (``ignore_result``)."""
        if self.ignore_result:
            return None
        return ledger.api_for(self.app).keep_result(self.app, result)

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
        raising = _eager_runs.raising
        raising.append(bool(self.app.conf.task_eager_propagates if throw is None else throw))
        try:
            with ledger.api_for(self.app).eager_run(self.app):
                return super().apply(args, kwargs, *more, **options)
        finally:
            raising.pop()


def refuse_reserved_headers(task_name: str, headers: Any) -> None:
    """Raise :class:`ReservedHeader` if a publish's ``headers`` name a field of Celery's own
    message (:func:`~celery_deadlines.rules.stamping.reserved_headers`): Celery would let
    the header replace it (the message's id, its task). Nothing has been recorded or
    published yet."""
    reserved = stamping.reserved_headers(headers if isinstance(headers, Mapping) else dict(headers))
    if reserved:
        uses = "; ".join(f"{key}: {stamping.PROTOCOL_HEADERS[key]}" for key in reserved)
        raise ReservedHeader(
            f"{task_name}: apply_async(headers=...) sets {', '.join(reserved)}, which "
            "Celery's own message fields are: a header of that name would replace the "
            "field (another run's id, another task). Set them with their own options "
            f"({uses}); nothing was published"
        )


def end_after_body(attempt: Attempt, exc: BaseException, *, task: Any = None) -> None:
    """Write the run's outcome for a body that raised ``exc``, as Celery reads ``exc``
    (the caller re-raises it). With an effect dispatched and no outcome known, whatever
    was raised, the run ends UNKNOWN and :class:`~celery_deadlines.core.body.Unresolved` is
    raised instead: never FAILED, never released to run again. A run that fails after
    effects were performed names them in its record and in ``exc``'s notes."""
    if attempt.unresolved:
        end_unresolved(attempt, exc, task=task)
    celery: outcomes.CeleryEnd = None
    if isinstance(exc, Ignore):
        celery = "ignore"
    elif isinstance(exc, Reject):
        celery = "requeue" if getattr(exc, "requeue", False) else "reject"
    outcome = outcomes.after_body(
        exc, celery=celery, unresolved_keys=attempt.unresolved, performed=attempt.performed
    )
    note = outcomes.note_for(outcome, attempt.performed)
    if note is not None:
        # the caller's error says it too: its traceback (any result serializer) and
        # the exception's notes (a pickling backend, an eager run, Sentry)
        exc.add_note(note)
    if outcome.released:
        attempt.release(outcome.detail)
    elif outcome.status == Status.FAILED:
        # the run's page and explain show what Celery's result would (bounded)
        trace = outcomes.bounded_traceback("".join(format_exception(exc)))
        attempt.end(outcome.status, outcome.reason, outcome.detail, trace)
    elif outcome.status is not None:
        attempt.end(outcome.status, outcome.reason, outcome.detail)


def end_eager_overrun(attempt: Attempt, *, task: Any) -> DeadlineRefused | None:
    """The refusal an eager body that ran past its deadline ends with, its run ended
    EXPIRED (UNKNOWN when an effect lacks an outcome): its end was refused, and no
    worker's supervisor or reconciler will end the run, as they end a worker's. ``None``
    when the deadline has not passed by the ledger's clock (the lease was lost otherwise)
    or the run is not this attempt's any more: nothing is changed then."""
    deadline = attempt.lease.deadline
    now = attempt.database_now()
    if deadline is None or now < deadline:
        return None
    reason = gates.expiry_reason(delivery_task=getattr(task, "deadline_kind", None) == "delivery")
    detail = "the eager body ran past its deadline"
    written = attempt.end_overrun(Status.EXPIRED, reason.value, detail)
    if written != Status.EXPIRED:
        return None
    ended = Expired(attempt.lease.task_id, task.name, written, reason.value, deadline, detail)
    return ended.refusal(gates.Gate.ATTEMPT.value, now, detail)


def hand_attempts_to_the_body() -> None:
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
    # an attribute of the class, not a method in its body: Celery's tracer calls a
    # task's __call__ whenever its class defines one, at about 3,000 instructions a
    # message, and without a ledger there is nothing for it to do
    type.__setattr__(DeadlineTask, "__call__", DeadlineTask._call_body)
    _attempts_handed = True


__all__ = ["DeadlineTask", "end_after_body", "hand_attempts_to_the_body"]
