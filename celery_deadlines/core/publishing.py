"""Publishing: a message's stamp, the enqueue gate, the run's row, and the send.

Every message is stamped by one rule, :func:`stamp`: its own deadlines (the call's
options, else a deadline header, else a DeadlineTask's budgets) combined with what it
inherits (:func:`celery_deadlines.core.propagation.inherited`: a ``deadline_scope``, the
running task), the earlier winning, shortened by Celery's ``expires``. Three callers
ask it: ``DeadlineTask.apply_async`` (:func:`publish`: the enqueue gate follows, and,
with the ledger, the run's row), the workflow gate (:mod:`celery_deadlines.core.canvas`,
the deadline a canvas's first step would carry) and the ``before_task_publish`` hook
(:func:`on_before_task_publish`: every message that does not go through
``apply_async``: plain tasks sent from a deadline task, ``app.send_task`` by name,
Celery's own ``chord_unlock``). :func:`stamp_own_budget` is the one shortcut of the rule
(a task's own budget on a plain publish, in epoch seconds), beside it, with its
measurement.

With the ledger on, the run is recorded before its message is sent: the ledger answers
when to send it (:class:`~celery_deadlines.rules.records.Recorded`: now, at the caller's
commit, or not at all), and the send is made here, Celery's own ``apply_async``.

Receivers of ``before_task_publish`` cannot refuse a publish (Celery logs and swallows
their exceptions), so the enqueue gate lives in ``apply_async``; a message stamped by
the hook is gated when a worker claims it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any, Final, NamedTuple, NoReturn

from celery import current_app
from celery.utils import uuid

from .. import clock, ledger
from ..clock import get_clock
from ..conf import settings_for
from ..errors import InvalidDeadline, ReservedHeader
from ..ledger._crashpoints import hit
from ..rules import gates, stamping, wire
from ..rules.budgets import Governed
from ..rules.records import Recorded
from ..rules.stamping import CALL_OPTIONS, NOTHING, Inherited
from . import backlog, options, propagation, recording
from .refusals import report_refusal

logger = logging.getLogger("celery_deadlines")

#: Celery's own ``apply_async`` (``DeadlineTask``'s parent class's, bound), which sends
#: a message as :func:`stamp_message` left it.
CeleryPublish = Callable[..., Any]


class CeleryCall(NamedTuple):
    """One ``apply_async`` call as Celery's own takes it: its positional arguments, then
    ``options``, the keyword options (stamped in place: the deadline header, ``expires``)."""

    args: Any
    kwargs: Any
    task_id: str | None
    producer: Any
    link: Any
    link_error: Any
    shadow: str | None
    options: dict[str, Any]

    def links(self) -> dict[str, Any]:
        """What is kept with the recorded message so that a republish is the same one."""
        return {"link": self.link, "link_error": self.link_error, "shadow": self.shadow}


def publish(task: Any, celery_publish: CeleryPublish, sent: CeleryCall) -> Any:
    """``DeadlineTask.apply_async``: the publish stamped (:func:`stamp_message`, the
    enqueue gate), recorded when the ledger is on, and sent through ``celery_publish``.
    Raises what :meth:`DeadlineTask.apply_async` says; nothing is published then."""
    call, task_id = sent.options, sent.task_id
    given = call.get("headers")
    if given:
        refuse_reserved_headers(task.name, given)
    if not ledger.enabled_for(task.app):
        stamped = stamp_own_budget(task, call, task_id)
        if stamped is None:
            stamped = stamp_message(task, call, task_id, False)[0] is not None
        if stamped:
            judge_the_queue_ahead(task, call, task_id)
        return _send(celery_publish, stamped, sent)
    stamp, starts_at = stamp_message(task, call, task_id, True)
    assert stamp is not None  # the ledger records every run it publishes
    judge_the_queue_ahead(task, call, task_id)
    if task_id is None:
        sent = sent._replace(task_id=uuid())
    return _record_and_send(task, celery_publish, sent, stamp, starts_at)


def judge_the_queue_ahead(task: Any, call: dict[str, Any], task_id: str | None) -> None:
    """The enqueue gate's second rule, for a stamped publish: refused (and nothing
    published) when the queue ahead of it cannot reach it in time (rules/backlog.py)."""
    refused = backlog.admit(task, call)
    if refused is not None:
        refuse_enqueue(task, refused, task_id)


def _record_and_send(
    task: Any,
    celery_publish: CeleryPublish,
    sent: CeleryCall,
    stamp: stamping.Stamp,
    available_at: datetime | None,
) -> Any:
    """Record the run (or hand the running attempt's run to its retry), then send its
    message when the ledger says (:class:`Recorded`). Returns what the send returned, or
    the run's ``AsyncResult`` when nothing is sent now."""
    api = ledger.api_for(task.app)
    task_id, call = sent.task_id, sent.options
    assert task_id is not None  # publish made it
    body, content_type, encoding, queue = recording.message_of(
        task, sent.args, sent.kwargs, call, sent.links()
    )

    def send() -> Any:
        return _send(celery_publish, True, sent)

    retries = int(call.get("retries") or 0)
    retry_of = recording.retrying(task, task_id)
    if retry_of is not None:
        api.hand_to_retry(retry_of, retries=retries, available_at=available_at, message_body=body)
        sent = send()
        hit("retry.published", task_id)
        return sent
    run = recording.new_run(
        task,
        task_id,
        call,
        stamp,
        available_at,
        retries=retries,
        message=(body, content_type, encoding),
        queue=queue,
    )
    app = task.app
    if app.conf.task_always_eager:  # the send runs it here: Celery's apply()
        with api.eager_run(app):
            api.record_eager_run(app, run)
            return send()
    recorded = api.record_run(app, run, publisher=recording.publishing_attempt())
    if recorded is Recorded.NOW:
        hit("outbox.recorded", task_id)
        try:
            sent = send()
        except Exception as exc:
            api.publish_failed(app, task_id, exc)
            raise
        hit("outbox.published", task_id)
        if sent is not None:
            return sent
    elif recorded is Recorded.AT_COMMIT:

        def send_after_commit() -> None:
            hit("outbox.recorded", task_id)
            try:
                send()
                hit("outbox.published", task_id)
            except Exception:
                logger.exception(
                    "publishing %s[%s] after commit failed; the outbox sweeper will publish "
                    "it again",
                    run.task_name,
                    task_id,
                )

        api.send_at_commit(app, send_after_commit)
    return task.AsyncResult(task_id)


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


# -- the stamp: one rule ---------------------------------------------------------------


def stamp(
    task: Any,
    call: dict[str, Any],
    headers: dict[str, Any],
    *,
    now: datetime,
    parent: Inherited,
    task_id: str | None,
    times: options.Times | None = None,
    horizon: timedelta | None = None,
    expires: object = None,
    needed: bool = True,
    clamp_logged_as: object = None,
) -> stamping.Stamp | None:
    """The deadlines a publish carries, by the one rule: its own (the call's options
    taken out of ``call``, else a deadline header in ``headers``, else, of the
    DeadlineTask ``task``, its budgets from ``times``) combined with ``parent``, what it
    inherits (the earlier wins), then shortened by Celery's ``expires`` (the call's,
    else the task's; of a message the publish hook stamps, ``task`` ``None``, its
    header, its deadlines read against ``horizon``, its delivery deadline kept from its
    header too). ``None`` when it names nothing and inherits nothing and no stamp is
    ``needed`` (the message is Celery's own). A clamp of the call's own deadline is
    logged under ``clamp_logged_as`` (``None``: not logged). Raises
    :class:`InvalidDeadline` for a bad option or header."""
    if task is None:
        assert horizon is not None
        own = stamping.own_deadlines(call, headers, now, horizon)
        if own.delivery is None:
            own = own._replace(delivery=stamping.delivery_deadline(headers, now, horizon))
    else:
        assert times is not None
        own = options.own_deadlines(task, call, headers, now, times)
        if own is stamping.NO_OWN and parent is NOTHING and not needed:
            # call options that name no instant (``budget=None``) on a task with no
            # budget, outside any task or scope: nothing to stamp or gate
            return None
        # the caller's ``expires``, else the task's (an explicit None clears it, as
        # Celery's own merge of the task's options does)
        expires = call.get("expires", task.expires)
    stamped = stamping.stamp_for(own, parent, now=now, expires=expires, task_id=task_id)
    governed = stamped.governed
    if (
        governed.clamped_from is not None
        and clamp_logged_as is not None
        and (task is None or own.source == "call")
    ):
        log_clamp(clamp_logged_as, task_id, governed)
    return stamped


def inherited_by(task: Any) -> Inherited:
    """What a publish of the DeadlineTask ``task`` inherits: a delivery task (a
    notification) lives by the delivery deadline, never by the execution one."""
    parent = propagation.inherited()
    if task.deadline_kind == "delivery" and parent is not NOTHING:
        parent = parent._replace(deadline=parent.delivery)
    return parent


def stamp_message(
    task: Any, call: dict[str, Any], task_id: str | None, with_ledger: bool
) -> tuple[stamping.Stamp | None, datetime | None]:
    """Stamp a DeadlineTask's publish into ``call``'s headers (taking this package's
    options out of it), by :func:`stamp`, after the enqueue gate; return the stamp and
    when the message may first start. ``None`` for the stamp when there is no deadline
    anywhere and no ledger (the message is Celery's own, and no clock is read). Raises
    the enqueue gate's refusal."""
    settings = settings_for(task.app)
    times = options.times(task, settings)  # the task's durations, worked out once
    parent = inherited_by(task)
    if parent is NOTHING and not with_ledger and times.name_nothing(call):
        return None, None
    now = get_clock().now()
    given = call.get("headers")
    headers = dict(given) if given else {}
    if parent.unreadable is not None:
        detail = "the parent task's deadline is unreadable"
        refuse_enqueue(task, gates.invalid(gates.Gate.ENQUEUE, now, detail), task_id)
    stamped = stamp(
        task,
        call,
        headers,
        now=now,
        parent=parent,
        task_id=task_id,
        times=times,
        needed=with_ledger,
        clamp_logged_as=task.name,
    )
    if stamped is None:
        return None, None
    governed = stamped.governed
    starts_at = options.start_of(call, now)
    if governed.deadline is not None:
        reserve = times.duration("reserve")
        start = now if starts_at is None or starts_at < now else starts_at
        if start > gates.latest_start(governed.deadline, reserve):
            decision = gates.admit(
                gates.Gate.ENQUEUE, governed.deadline, now, reserve, starts_at=starts_at
            )
            refuse_enqueue(task, decision, task_id)
    stamped = stamping.for_deadline_task(
        stamped, expires=call.get("expires", task.expires), starts_at=starts_at
    )
    stamping.write(headers, stamped)
    if headers:
        call["headers"] = headers
    return stamped, starts_at


#: Celery's call options that move or bound a message's start (a publish with one is
#: stamped by the full rule).
_MOVES_START: Final = frozenset({"eta", "countdown", "expires"})
#: Headers a caller may give that name a deadline of its own.
_DEADLINE_HEADERS: Final = frozenset({wire.DEADLINE_HEADER, wire.DELIVERY_DEADLINE_HEADER})


def stamp_own_budget(task: Any, call: dict[str, Any], task_id: str | None) -> bool | None:
    """:func:`stamp_message`'s shortcut for the plain cases of a publish without the
    ledger, stamped into ``call``: one that inherits nothing and names nothing of its
    own (no option of this package's, no deadline header) of a task that says no budget
    anywhere is Celery's own (``False``: nothing written); of a task whose budget is
    longer than its reserve, with no delivery budget, and no ``expires``, ``eta`` or
    ``countdown``, its headers are written in epoch seconds, as the full rule would
    (``True``). ``None``, nothing written, for any other publish.

    It decides only what the rule would (``tests/unit/core/test_fast_paths.py`` holds the two
    equal). Kept for what it saves: a whole publish of a task with a budget (Celery's
    code included, ``bench/worker_instructions.py --side publish``, 2026-12-05) counted
    1,139,476 instructions with it and 1,184,100 without (plain Celery: 1,104,300), the
    library's share 35,200 instead of 79,800; 3,300 fewer for a task without one."""
    if not CALL_OPTIONS.isdisjoint(call) or propagation.inherited() is not NOTHING:
        return None
    given = call.get("headers")
    if given and not _DEADLINE_HEADERS.isdisjoint(given):
        return None
    limits = options.in_seconds(task, settings_for(task.app))
    if limits.names_nothing:
        return False
    budget = limits.budget
    if budget is None or task.expires is not None or not _MOVES_START.isdisjoint(call):
        return None
    headers = dict(given) if given else {}
    headers[wire.DEADLINE_HEADER] = clock.epoch() + budget
    headers[wire.SOURCE_HEADER] = limits.budget_source
    if task_id:
        headers[wire.ORIGIN_HEADER] = task_id
    call["headers"] = headers
    return True


def refuse_enqueue(task: Any, decision: gates.Decision, task_id: str | None) -> NoReturn:
    """Refuse the publish: nothing is sent. With the ledger the refused run is on record
    too (under a fresh id if the caller gave none), never published, and a publish
    under its id again is judged again; a run already recorded under the id (this one
    repeats its publish) stands as it is (:func:`recording.record_refused_publish`)."""
    decision = task._kind_of(decision)
    report_refusal(task, task_id, task.name, decision)
    refusal = decision.refusal()
    if ledger.enabled_for(task.app):
        recording.record_refused_publish(
            task.app, decision, task_name=task.name, task_id=task_id or uuid()
        )
    raise refusal


# -- the send ----------------------------------------------------------------------------

#: The id of the message :func:`publish` is sending in this context, stamped and clamped
#: already: the one message the publish hook leaves as it is. A header cannot say
#: "stamped" (whoever publishes writes the headers); only this can. Set around Celery's
#: publish of that message and reset after it (``set``/``reset``, not a context manager:
#: every publish of a DeadlineTask does it).
STAMPED: Final[ContextVar[str | None]] = ContextVar("celery_deadlines_stamped", default=None)


def _send(celery_publish: CeleryPublish, stamped: bool, sent: CeleryCall) -> Any:
    """Celery's own publish of the message as :func:`stamp_message` left it: the one way
    into Celery. A ``stamped`` message is published under :data:`STAMPED`, so the
    publish hook does not stamp it again (its id, Celery's to make otherwise, is made
    here); an unstamped one is judged by the hook like any message."""
    args, kwargs, task_id, producer, link, link_error, shadow, call = sent
    if not stamped:
        return celery_publish(args, kwargs, task_id, producer, link, link_error, shadow, **call)
    task_id = task_id or uuid()
    token = STAMPED.set(task_id)
    try:
        return celery_publish(args, kwargs, task_id, producer, link, link_error, shadow, **call)
    finally:
        STAMPED.reset(token)


# -- the publish hook --------------------------------------------------------------------


def on_before_task_publish(
    sender: str | None = None,
    headers: dict[str, Any] | None = None,
    properties: dict[str, Any] | None = None,
    **_: Any,
) -> None:
    """``before_task_publish`` receiver: inherit, stamp (:func:`stamp`), and set
    ``expires``.

    Every message is clamped to the deadline it inherits, whatever deadline headers its
    publisher wrote (``send_task(headers={"x_deadline": ...})`` cannot outlive its parent);
    an inherited deadline that cannot be read is passed on as it is, so the worker refuses
    the child. Only the message :func:`publish` is sending right now (:data:`STAMPED`) is
    left as it is: it was clamped there.
    """
    if headers is None:
        return
    here = STAMPED.get()
    if here is not None and here == headers.get("id"):
        return
    call = properties if properties is not None else {}
    parent = propagation.inherited()
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
        stamped = stamp(
            None,
            call,
            headers,
            now=now,
            parent=parent,
            task_id=task_id,
            horizon=horizon,
            expires=headers.get("expires"),
            clamp_logged_as=sender,
        )
    except InvalidDeadline as exc:
        # A receiver cannot raise to the caller: keep the bad value so the worker
        # refuses the message with invalid_deadline and the caller's result says so.
        logger.error("%s[%s]: unusable deadline at publish: %s", sender, task_id, exc)
        headers[wire.DEADLINE_HEADER] = explicit if explicit is not None else str(exc)
        headers.pop(wire.SOURCE_HEADER, None)
        return
    assert stamped is not None  # needed: a stamp is always made for the hook's message
    stamping.write(headers, stamped)


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
