"""The claim gate and the time-limit cap, in the worker's main process.

Celery calls ``Request.revoked()`` right before handing a message to the pool (on
arrival, in a prefork worker), and also when it arrives if it has ``expires`` (a message
waiting for its ETA, or the caller's own), so the claim gate here sees the time a message
spent in the queue and, for a delayed one, in the worker. A refused message is
acknowledged (never requeued), its failure is stored with the typed
:class:`DeadlineRefused` (or as Celery's own expiry: :mod:`celery_deadlines.core.refusals`),
and ``deadline_refused`` is sent.

``execute_using_pool`` reads ``time_limits`` right before ``pool.apply_async``; the
property below caps them at the budget left at that instant (the attempt gate). Only
the prefork pool enforces both limits; docs/explanation/pools.md covers the others.

Before any of it, a message's envelope (:mod:`celery_deadlines.rules.envelope`): the
fields this package reads of every message are checked when it is handed to the pool,
and a message Celery cannot make a request of is refused by the task's strategy
(:func:`strategy`) instead of its error stopping the worker: ``invalid_message``.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Mapping
from contextlib import suppress
from datetime import datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, Final, Literal

from celery.exceptions import InvalidTaskError
from celery.utils.time import maybe_iso8601
from celery.worker.request import Request
from celery.worker.state import task_ready
from celery.worker.strategy import default as celery_strategy
from kombu.exceptions import ContentDisallowed, DecodeError

from .. import clock, ledger
from ..clock import get_clock
from ..conf import settings_for
from ..errors import DeadlineRefused
from ..rules import envelope, gates, outcomes, stamping, wire
from ..rules.envelope import LONGEST_ID, MOST_RETRIES, is_duration
from ..rules.quoting import shown
from ..rules.records import ENDED_IT, Refusal
from . import options, recording, supervision
from .body import AttemptAPI
from .claiming import answer_a_waiting_caller, result_policy
from .refusals import announce_expiry, report_refused_message
from .timelimits import HANDED, WORKER_LIMITS

logger = logging.getLogger("celery_deadlines")

#: Smallest time limit handed to billiard (``gates.MIN_TIME_LIMIT``).
MIN_TIME_LIMIT = gates.MIN_TIME_LIMIT


#: a worker that keeps no default limits (not a worker's app, or none recorded)
_NO_WORKER_LIMITS: Final = (None, None, None, None)

#: a hard time limit's outcome not decided yet
_UNDECIDED: Final = object()


def fast_iso8601(value: datetime | str | None) -> datetime | None:
    """Celery's ``maybe_iso8601`` contract, with the standard library's fast parser first."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass
    parsed: datetime | None = maybe_iso8601(value)
    return parsed


def _with_default(function: Callable[..., None], name: str, value: Any) -> Callable[..., None]:
    """``function`` with ``value`` as the default of its parameter ``name`` (a copy: the
    original keeps its own), or, if it has no such parameter, a wrapper that passes it."""
    code = function.__code__
    names = code.co_varnames[: code.co_argcount]
    defaults = list(function.__defaults__ or ())
    first_default = len(names) - len(defaults)
    if name not in names[first_default:]:

        def passing(self: Any, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault(name, value)
            function(self, *args, **kwargs)

        return passing
    defaults[names.index(name) - first_default] = value
    copy = types.FunctionType(
        code, function.__globals__, function.__name__, tuple(defaults), function.__closure__
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__qualname__ = function.__qualname__
    copy.__doc__ = function.__doc__
    return copy


def clearly_in_time(task: Any, deadline: float) -> bool:
    """The claim gate's shortcut: whether ``task``'s message with the deadline header
    ``deadline`` (epoch seconds) is clearly in time by this worker's clock (within the
    horizon, and before the last instant the gate admits, each by more than
    :data:`~celery_deadlines.core.options.EDGE`). ``False``: judge it in full
    (:meth:`DeadlineRequest._claim_refusal`), which decides the same for every message
    this admits (tests/unit/core/test_fast_paths.py holds the two equal)."""
    limits = options.in_seconds(task, settings_for(task.app))
    if not limits.local:
        return False  # a clock-skew budget: the ledger's clock decides
    ahead = deadline - clock.epoch()  # NaN or infinity: not clearly anything, judged in full
    return limits.low < ahead < limits.high


class DeadlineRequest(Request):
    """A worker request that refuses to start work its deadline no longer allows."""

    if TYPE_CHECKING:  # set by celery's Request, missing from the stubs
        _request_dict: dict[str, Any]
        _payload: Any
        _task: Any
        _app: Any
        _context: Any

    _deadlines: stamping.Inherited | None = None
    _reserve: timedelta | None = None
    #: the last instant the claim gate admits this message (:func:`gates.latest_start`)
    _latest_start: datetime | None = None
    _raw_time_limits: tuple[float | None, float | None] = (None, None)
    #: what the ledger wrote after a hard time limit (a status, or None), once decided
    _time_limit_written: str | object | None = supervision.UNDECIDED
    #: whether the claim gate admitted the message in epoch seconds, by this worker's
    #: clock (:func:`clearly_in_time`): the time-limit cap then measures in them too
    _in_seconds: bool = False
    #: whether the hard time limit handed to the pool is the deadline's cap (shorter than
    #: the task's own, or the task has none): then a kill by it is the deadline's
    _capped_by_deadline: bool = False
    #: whether ``expires`` is only the cap the run's deadline put there, once decided
    _expires_is_cap: bool | None = None
    #: the clock watch the hand-off judges by (the app's, looked up once), once looked up
    _handoff_watch: Any = _UNDECIDED

    # A message with ``expires`` (delayed, or the caller's own) carries it as ISO; Celery
    # parses it with dateutil, which costs more than this class's own work. This is
    # Celery's own ``__init__`` with the fast parser as its default, never an override
    # passing it on: that would repack every keyword argument of every message
    # (bench/worker_instructions.py counts it).
    __init__ = _with_default(Request.__init__, "maybe_iso8601", fast_iso8601)

    @property
    def tzlocal(self) -> tzinfo | None:
        """The app's timezone, read from the configuration once per app, not per message
        (kept on the app itself: this runs for every message that has ``expires``)."""
        app = self._app
        zone = getattr(app, _TIMEZONE, _UNDECIDED)
        if zone is _UNDECIDED:
            zone = app.conf.timezone
            setattr(app, _TIMEZONE, zone)
        return zone  # type: ignore[return-value]

    def revoked(self) -> bool:
        """Celery's revocation check, after the claim gate: a message the gate refuses is
        ended here (:meth:`_refuse`), as a revoked one is. Called once or twice per
        message (on arrival when it has ``expires``, and when handed to the pool)."""
        if self._already_revoked:
            return True
        # the fields this package reads of every message, before anything is judged by
        # them: envelope.fits, inline (every message;
        # tests/unit/core/test_request_malformed_messages.py holds the two equal)
        task_id = self.id
        retries = self._request_dict.get("retries")
        if (
            type(task_id) is not str
            or not 0 < len(task_id) <= LONGEST_ID
            or type(self.name) is not str
            or (
                retries is not None
                and (type(retries) is not int or not 0 <= retries <= MOST_RETRIES)
            )
        ):
            self._refuse_malformed()
            return True
        # no deadline header: nothing to judge (a delivery deadline alone is the delivery
        # gates'), no clock read. One as this package writes it (epoch seconds), clearly
        # in time, is admitted in seconds (clearly_in_time); any other is judged in full.
        # Inline, not calls: this runs for every message
        raw = self._request_dict.get(wire.DEADLINE_HEADER)
        if raw is not None:
            task = self._task  # Celery's property is a call more
            if type(raw) is float and isinstance(task, AttemptAPI) and clearly_in_time(task, raw):
                # which rule judged it (not a reading): the time-limit cap Celery reads
                # next measures in epoch seconds too, from a reading of its own
                self._in_seconds = True
            else:
                refusal = self._claim_refusal()
                if refusal is not None:
                    self._refuse(refusal)
                    return True
        try:
            revoked: bool = super().revoked()
        except Exception:
            # Celery's own reading of a field (``stamped_headers``; an expired message's
            # links, read as its revocation is stored) failed: the message's, if the
            # envelope's rule finds the field malformed
            if self._flaw() is None:
                raise
            self._refuse_malformed()
            return True
        return revoked

    def maybe_expire(self) -> Literal[True] | None:
        """Celery's ``expires`` check (on the local wall clock), unless ``expires`` is only
        the cap the run's deadline put there: then the claim gate above judges it, by
        the ledger's clock with a skew budget, and while that clock is in doubt the pool
        process's claim does. Celery's check would store ``REVOKED`` over the run's own
        outcome: a caller told ``DeadlineRefused`` of a run the sweeper expired must not
        read ``REVOKED`` once a worker whose clock is in doubt sees the late message. An
        earlier ``expires`` of the caller's own is still Celery's to enforce."""
        is_cap = self._expires_is_cap
        if is_cap is None:  # decided once: Celery asks at arrival and at the hand-off
            expires = self.expires
            try:
                deadline = self._carried(get_clock().now()).deadline
            except Exception:  # noqa: BLE001 - an unreadable header is the claim gate's
                deadline = None
            is_cap = self._expires_is_cap = (
                isinstance(expires, datetime)
                and expires.tzinfo is not None
                and deadline is not None
                and expires >= deadline
            )
        if is_cap:
            return None
        expired: Literal[True] | None = super().maybe_expire()
        return expired

    @property
    def time_limits(self) -> tuple[float | None, float | None]:
        """The time limits Celery would apply (the message's own, else the task's, else
        the worker's pool default) capped at the seconds the message's deadline leaves,
        noting whether the hard one handed to the pool is the deadline's; the message's
        own when it carries no deadline (Celery then adds the task's and the pool's).
        What the job is given goes to the pool process with it, with the worker's
        defaults (``timelimits.HANDED``: its claim records them, and who set each). Celery
        reads this once, right before it hands the job to the pool."""
        hard, soft = self._raw_time_limits
        worker = getattr(self._app, WORKER_LIMITS, None)
        remaining: float | None
        if self._in_seconds:
            # admitted in epoch seconds by this worker's clock: the seconds its header
            # leaves, read now (no datetime built: this runs for every message)
            remaining = self._request_dict[wire.DEADLINE_HEADER] - clock.epoch()
        elif not stamping.carries_deadlines(self._request_dict):
            # nothing to cap by (no clock read: this runs for every message)
            self._request_dict[HANDED] = (None, None, worker)  # no cap
            return hard, soft
        else:
            remaining = self._remaining()
            if remaining is None:
                self._request_dict[HANDED] = (None, None, worker)  # no cap
                return hard, soft
        # what Celery would apply: as rules.limits.celery_applies, inline (every message
        # with a deadline; tests/unit/rules/test_limits.py holds the two equal)
        task = self._task
        if worker is None:
            worker = _NO_WORKER_LIMITS
        celery_hard = hard or task.time_limit or worker[0]
        capped = gates.cap_time_limits(
            remaining, celery_hard, soft or task.soft_time_limit or worker[2], MIN_TIME_LIMIT
        )
        self._capped_by_deadline = not celery_hard or capped[0] < celery_hard
        self._request_dict[HANDED] = (*capped, worker)
        return capped

    @time_limits.setter
    def time_limits(self, value: Any) -> None:
        """The message's ``timelimit`` (Celery's request sets it): a pair of durations
        (:func:`envelope.is_duration`), else ``ValueError``: Celery's request is not made
        and the strategy refuses the message."""
        hard, soft = value
        if (hard is not None or soft is not None) and not (is_duration(hard) and is_duration(soft)):
            raise ValueError(f"timelimit {shown(value)} is not a pair of durations")
        self._raw_time_limits = (hard, soft)

    def _remaining(self) -> float | None:
        """The seconds the message's deadline leaves now; ``None`` when it carries no
        deadline or no clock can judge it (the ledger's clock in doubt)."""
        local = get_clock().now()
        deadline = self._carried(local).deadline
        if deadline is None:
            return None
        now = self._judging_now(local, self._watch())
        if now is None:
            return None
        return (deadline - now).total_seconds()

    def _carried(self, now: datetime) -> stamping.Inherited:
        """The deadlines the message carries, parsed once (``now``: the clock reading
        the first parse checks the horizon against)."""
        if self._deadlines is None:
            # Parsed once per message; a parse error must not escape into the consumer.
            headers = self._request_dict
            horizon = (
                settings_for(self._app or self.task.app).max_budget
                if stamping.carries_deadlines(headers)
                else gates.ZERO  # not read: there is nothing to check against it
            )
            self._deadlines = stamping.read_headers(headers, now, horizon, self.id)
        return self._deadlines

    def _watch(self) -> Any:
        """The clock watch (or ``None``) the arrival and the hand-off judge by, looked up
        once for both. A message that arrived before the reconciler started keeps judging
        by the wall clock: the pool process's claim measures against the ledger's clock
        anyway, and holds the run if the two disagree."""
        watch = self._handoff_watch
        if watch is _UNDECIDED:
            watch = self._handoff_watch = ledger.clock_watch(self._app or self.task.app)
        return watch

    def _judging_now(self, local: datetime, watch: Any = _UNDECIDED) -> datetime | None:
        """The time to judge deadlines by: the wall clock reading ``local``, or with a
        skew budget the ledger's time as the clock watch estimates it (``None`` while
        the clock is in doubt: the pool process's claim measures again and holds the run
        if need be). ``watch``: the clock watch when the caller has it, else looked up."""
        if watch is _UNDECIDED:
            watch = ledger.clock_watch(self._app or self.task.app)
        if watch is None:
            return local
        authority: datetime | None = watch.authority_now()
        if authority is not None and abs(local - authority) > watch.budget:
            watch.suspect()  # the wall clock moved since the last reading
        return authority

    def _claim_refusal(self) -> gates.Decision | None:
        """The claim gate's refusal of this message now by the full rule, ``None`` when it
        may start (a message with a deadline header). The deadline, the reserve and the last
        instant the gate admits are worked out once; each call reads the clock once and
        compares (``gates.admit`` is asked for a refusal)."""
        local = get_clock().now()
        try:
            carried = self._carried(local)
            if carried.unreadable is not None:
                return gates.invalid(
                    gates.Gate.CLAIM,
                    local,
                    f"unreadable deadline header {shown(carried.unreadable)}",
                )
            deadline = carried.deadline
            if deadline is None:
                return None
            judging = self._judging_now(local, self._watch())
            if judging is None:
                return None
            latest = self._latest_start
            if latest is None:
                task = self._deadline_task()
                times = options.times(task, settings_for(task.app))
                reserve = self._reserve = times.duration("reserve")
                latest = self._latest_start = gates.latest_start(deadline, reserve)
        except Exception as exc:  # noqa: BLE001 - a bad message or setting must never crash the consumer
            return gates.invalid(gates.Gate.CLAIM, local, f"cannot judge the deadline: {exc}")
        if judging <= latest:
            return None
        return gates.admit(gates.Gate.CLAIM, deadline, judging, self._reserve or gates.ZERO)

    def _deadline_task(self) -> AttemptAPI:  # DeadlineTask's base: no other task has it
        task = self.task
        if not isinstance(task, AttemptAPI):
            raise TypeError(f"{task.name} is not a DeadlineTask")
        return task

    def _refuse(self, decision: gates.Decision) -> None:
        """Acknowledge, store the typed failure, announce: never requeue, never run. The
        refusal is named by the task's registered name, as every gate names it (the
        message's ``shadow`` is whatever its producer wrote). A refused message that is
        malformed in any field (:func:`envelope.flaw`) is refused as such
        (``invalid_message``), its refusal stored only under an id that can name a
        result, with nothing of the message but its id (:func:`_storing`)."""
        task = self.task
        if isinstance(task, AttemptAPI) and task.deadline_kind == "delivery":
            decision = gates.as_delivery(decision)  # a delivery task's deadline is its delivery
        headers = self._request_dict
        malformed = decision.reason is gates.Reason.INVALID_MESSAGE
        if not malformed:
            # every field of a refused message is judged (a refusal is rare: the message
            # that runs is judged by the fields read of every message alone)
            detail = self._flaw()
            if detail is not None:
                decision = gates.invalid_message(decision.gate, decision.clock_reading, detail)
                malformed = True
        decision, task_id, retries = _storing(task, headers, decision)
        exc = decision.refusal()
        with suppress(TypeError):  # an id no set takes: Celery's state never held it
            task_ready(self)
        # recorded first: what the refusal did to the run says how it is reported (a
        # late delivery of a run that had ended is not its refusal again)
        source = None if malformed else stamping.header_source(headers)
        outcome = (
            ENDED_IT
            if task_id is None
            else _ended_in_ledger(task, decision, task_id, retries, self._reserve, source)
        )
        report_refused_message(
            task,
            task.app,
            envelope.task_id(headers),
            task.name,
            decision,
            outcome,
            carrier=None if malformed else headers,
        )
        if task_id is not None and outcome:
            revoked_as = outcomes.celery_revocation(exc.reason, source)
            if revoked_as is not None:
                # cancelled, or the deadline was the message's own expires
                announce_expiry(self, revoked_as)
            else:
                self.send_event("task-failed", exception=repr(exc), traceback="")
                context = None if malformed else (lambda: self._context)
                _store_refusal(task, task_id, exc, context, self.store_errors)
        self.acknowledge()
        self._already_revoked = True

    def _flaw(self) -> str | None:
        """What the envelope's rule finds malformed in this message, or ``None``."""
        return envelope.flaw(self._request_dict, self._payload)

    def _refuse_malformed(self) -> None:
        """Refuse a message whose envelope cannot be judged (``invalid_message``)."""
        detail = self._flaw() or "its envelope cannot be judged"
        self._refuse(gates.invalid_message(gates.Gate.CLAIM, get_clock().now(), detail))

    # -- the ledger, told by the supervisor about its pool processes -------------------

    def on_timeout(self, soft: bool, timeout: float) -> None:
        if soft or not supervision.settled_here(supervision.time_limit_outcome(self, timeout)):
            super().on_timeout(soft, timeout)  # stores TimeLimitExceeded for the caller
        # else: an effect's outcome is unknown, or the run was cancelled, and the caller
        # was told so (supervision)

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        if not supervision.failed(self, exc_info):
            super().on_failure(exc_info, send_failed_event, return_ok)


class Strategies(dict[Any, Any]):
    """A worker consumer's table of task strategies by task name, in which a name no task
    can have (unhashable: a list or a mapping in a message's ``task`` header) is not
    found, as an unregistered name is not: Celery's consumer then tells the message's
    caller ``NotRegistered`` and rejects it. Its lookup, ``strategies[name]``, raised
    ``TypeError`` on such a name instead, and stopped the worker."""

    def __getitem__(self, name: Any) -> Any:
        try:
            return super().__getitem__(name)
        except TypeError:
            raise KeyError(name) from None


def guard_consumers() -> None:
    """Give every worker consumer made from now on a :class:`Strategies` table
    (idempotent)."""
    from celery.worker.consumer.consumer import Consumer

    Consumer.Strategies = Strategies


def strategy(task: Any, app: Any, consumer: Any, **options: Any) -> Callable[..., Any]:
    """Celery's strategy for a DeadlineTask's messages (``DeadlineTask.Strategy``), with
    the envelope's rule behind it: when Celery cannot make or hold the request of a
    message (its id absent or of a type no set takes, a body that is not three parts,
    an ``eta`` or ``expires`` it cannot read, a ``timelimit`` that is not two durations)
    and the rule finds the message malformed (:func:`envelope.flaw`), or Celery's own
    words say it cannot read it, the message is refused with ``invalid_message``
    (:func:`refuse_message`) instead of the error stopping the worker. Any other error
    is Celery's, as is a message of Celery's protocol 1 (its fields in the body). A
    message that keeps the rule pays for one call more."""
    handle = celery_strategy(task, app, consumer, **options)

    def deadline_task_message_handler(
        message: Any, body: Any, ack: Any, reject: Any, callbacks: Any
    ) -> Any:
        try:
            return handle(message, body, ack, reject, callbacks)
        except Exception as failed:
            detail = _malformed(message, body, failed)
            if detail is None:
                raise
        refuse_message(task, consumer, message.headers, detail, ack)
        return None

    return deadline_task_message_handler


def _malformed(message: Any, body: Any, failed: Exception) -> str | None:
    """Why Celery could not take ``message`` (it raised ``failed``), if it is malformed:
    the envelope's flaw, or Celery's own words for an ``eta`` or ``expires`` it cannot
    read; ``None`` when the error is not the message's to answer for (a body that does
    not decode, a message of protocol 1: Celery's own handling)."""
    if body is not None or isinstance(failed, (DecodeError, ContentDisallowed)):
        return None
    try:
        payload, headers = message.payload, message.headers
    except Exception:  # noqa: BLE001 - not decoded: Celery's to report
        return None
    if type(payload) is dict and "args" in payload:  # Celery's "hybrid": protocol 1's body
        return None
    detail = envelope.flaw(headers, payload)
    if detail is None and isinstance(failed, InvalidTaskError):
        detail = f"Celery cannot read it: {shown(str(failed), 160)}"
    return detail


def refuse_message(
    task: Any, consumer: Any, headers: Mapping[str, Any], detail: str, ack: Any
) -> None:
    """Refuse a message Celery could not take (``detail``: why), at the claim gate:
    logged once at WARNING, ``deadline_refused`` sent, acknowledged, stored as
    :func:`_storing` says, with nothing of the message but its id (no errback, chord or
    chain of it is called)."""
    decision = gates.invalid_message(gates.Gate.CLAIM, get_clock().now(), detail)
    decision, task_id, retries = _storing(task, headers, decision)
    exc = decision.refusal()
    outcome = (
        ENDED_IT
        if task_id is None
        else _ended_in_ledger(task, decision, task_id, retries, None, None)
    )
    report_refused_message(task, task.app, envelope.task_id(headers), task.name, decision, outcome)
    if task_id is not None and outcome:
        dispatcher = consumer.event_dispatcher
        if dispatcher and dispatcher.enabled and task.send_events:
            dispatcher.send("task-failed", uuid=task_id, exception=repr(exc), traceback="")
        ignore_result = headers.get("ignore_result")  # as Celery's request reads it
        if ignore_result is None:
            ignore_result = task.ignore_result
        stores = not ignore_result or task.store_errors_even_if_ignored
        _store_refusal(task, task_id, exc, None, stores)
    ack(logger, consumer.connection_errors)


def _storing(
    task: Any, headers: Mapping[str, Any], decision: gates.Decision
) -> tuple[gates.Decision, str | None, int]:
    """The refusal as it is reported, the id its failure is stored under (``None``:
    nothing is stored) and the attempt it ends in the ledger. A refusal is stored only
    under an id that can name a result (:func:`envelope.task_id`); with the run ledger,
    only when the message's ``retries`` names an attempt too (else no run is touched).
    The decision's detail says when nothing is stored."""
    task_id = envelope.task_id(headers)
    retries = envelope.retries(headers)
    if task_id is None:
        why = "its id cannot name a result"
    elif retries is None and isinstance(task, AttemptAPI) and ledger.enabled_for(task.app):
        why = "its retries name no attempt of a run"
    else:
        return decision, task_id, retries or 0
    detail = f"{decision.detail}; nothing is stored: {why}"
    return decision._replace(detail=detail), None, 0


def _ended_in_ledger(
    task: Any,
    decision: gates.Decision,
    task_id: str,
    retries: int,
    reserve: timedelta | None,
    source: str | None,
) -> Refusal:
    """Record the refusal in the ledger: what it did to the run, false if it did not end
    it (it had ended, another worker owns it, the ledger's clock does not confirm it).

    Without the ledger every refusal ends its run. With it, a refused duplicate of a
    run that already ended, or that another worker is running, must not store a
    failure over that run's own result; a caller of an ended run still waiting is
    told how it ended (:func:`~celery_deadlines.core.claiming.answer_a_waiting_caller`;
    ``source``: where the message's deadline came from, which decides how).
    """
    if not isinstance(task, AttemptAPI) or not ledger.enabled_for(task.app):
        return ENDED_IT
    try:
        ended_it = recording.record_refusal(
            task.app,
            decision,
            task_name=task.name,
            task_id=task_id,
            retries=retries,
            reserve=reserve,
        )
    except Exception:  # the message is still refused; the sweeper expires the run
        logger.exception("recording the refusal of %s in the ledger failed", task_id)
        return ENDED_IT
    if ended_it.outcome == Refusal.ALREADY_ENDED:
        # whoever ended it may have died (or lost the result to a broker restart)
        # before the caller was told; a caller still waiting is told (``source``: where
        # the message's deadline came from, which decides how)
        answer_a_waiting_caller(result_policy(task), task_id, decision.clock_reading, source=source)
    return ended_it


def _store_refusal(
    task: Any,
    task_id: str,
    exc: DeadlineRefused,
    request: Callable[[], Any] | None,
    store_result: bool,
) -> None:
    """Store a refusal as the task's failure (``request``: makes the message's, whose
    chord and errbacks Celery tells; ``None``: none). A refusal whose result cannot be
    stored (the backend is away, or cannot take what the message carries) is logged at
    ERROR and its message is still acknowledged, as Celery's main process does with a
    failure it cannot store: no message stops the worker."""
    try:
        context = None if request is None else request()
        task.backend.mark_as_failure(task_id, exc, request=context, store_result=store_result)
    except Exception:
        logger.exception("%s[%s]: storing its refusal failed", task.name, task_id)


#: The app attribute its timezone is kept in (``DeadlineRequest.tzlocal``).
_TIMEZONE: Final = "_celery_deadlines_timezone"
