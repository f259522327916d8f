"""The workflow gate: a chain, group or chord that cannot fit its deadline is refused
whole, before anything of it is published.

The rule is :func:`celery_deadlines.rules.workflows.fit`; here the canvas becomes a tree of
steps, each step's durations come from :mod:`celery_deadlines.core.options` (the task's
``attempt_timeout`` or ``time_limit``, its ``reserve``, the contracts and settings, as
the retry and enqueue gates read them; a signature's ``time_limit`` can only shorten the
attempt, its ``countdown``/``eta`` delays the step), and the governing deadline is the
one the first step would be published with (:func:`publishing.stamp`: the call
options, a ``deadline_scope``, the running task's deadline, the task's budget).

Where it acts. A group publishes its members one by one and a chord its header's (and,
with a result backend without native chords, ``chord_unlock`` before them), so no
single task's ``apply_async`` sees a whole group before part of it is out. The gate is
therefore a wrapper around ``apply_async`` of Celery's three canvas classes
(``celery.canvas._chain``, ``group`` and ``_chord``: ``chain`` is a subclass, ``chord``
the same class), put in place by :func:`patch` (called by :func:`celery_deadlines.install`).
The wrapper is contained: it checks the canvas, then calls Celery's own method with the
same arguments; it never changes what Celery publishes or returns. It is idempotent
(patched once per process) and :func:`unpatch` removes it.

Covered: ``apply_async``, ``delay`` and calling (``chain(...)()``, ``group(...)()``,
``chord(header)(body)``) of a chain, group or chord, nested in any way, from a web view,
a script or a task body (``Task.replace`` included), when it holds at least one
DeadlineTask. Plain tasks in it count as steps of zero (named in the detail), and so do
tasks the app does not know. A canvas of plain tasks only is not checked. Eager mode
(``task_always_eager``) is checked the same way. Celery's own canvas and chord tests
(``make celery-compat``: ``t/unit/test_canvas.py``, ``t/unit/tasks/test_canvas.py``,
``t/unit/tasks/test_chord.py``) pass with the gate in place.

What it reads. A canvas is judged only when a deadline governs it and it holds a
DeadlineTask, and the governing deadline is the one its first step would be published
with; so the gate reads no more of a canvas than that takes:

* an app that registers no DeadlineTask (a plain ``celery.Task`` app in the same
  process: the patch is process-wide) has none of its canvases read: no step of them
  can be a DeadlineTask (each is looked up in the canvas's app);
* otherwise the canvas is read in Celery's order up to its first step; when that step
  would be published with no deadline (none in the call's or the canvas's options, no
  ``deadline_scope``, no running task's deadline, and the step is a plain task or a
  DeadlineTask without a budget, its own or its contract's), the gate stops there:
  nothing to judge;
* only when a deadline governs is the rest of the canvas read, since every step counts
  toward the critical path, before anything of it is published; except a generator.

In every case Celery's own method is then called with the canvas as it was. This keeps
Celery's promise for a group or a chord's header given a generator (celery#3021: Celery
publishes the members as the generator yields them, with one member of look-ahead, and
on a backend with native chords, Redis's, it does so for a chord's header too). The gate
reads such a generator no further than its first member (with the same look-ahead),
which Celery reads before its first publish anyway, through Celery's own ``regen``,
which keeps what was read; Celery consumes the rest as it publishes, deadline or not.
What the gate judges of it: its first member, as the group's need (a lower bound: a
group needs at least what each member needs), with what must follow it (a chord's body,
the rest of a chain) and whatever else the canvas holds. What it cannot judge: the
members the generator has not yielded yet; each of them passes its own enqueue gate as
Celery publishes it (a member that can no longer start is refused there, with
``DeadlineRefused``, after the members before it were published), and its own claim and
attempt gates. A chain given a generator is read whole (Celery 5.7 itself reads it
whole before its first publish).

Not covered, on purpose or by nature:

* a workflow's later hops: a workflow is checked once, when it is enqueued; what a
  worker publishes next (the rest of a chain, which Celery's tracer passes as
  ``chain=``; a chord's body, published by the header task that completes the chord or
  by ``celery.chord_unlock``) passes each step's own enqueue gate as before, and so does
  a canvas applied with an explicit ``chain=`` option;
* a single task's ``apply_async`` (``link=`` callbacks included): the enqueue gate as
  before; nothing is added to its path;
* ``chunks``, ``xmap`` and ``xstarmap``: one plain message each (``celery.chunks``,
  ``celery.starmap``), checked as a step of zero when inside a canvas;
* a group whose members would have different deadlines (different budgets, no
  ``deadline_scope``) is judged against its first member's; give a workflow one deadline
  with :func:`~celery_deadlines.deadline_scope` or ``apply_async(budget=...)``;
* an ``eta`` counts as the countdown it is from the enqueue (exact for the first steps,
  longer than it will be for later ones).

A refusal raises :class:`~celery_deadlines.errors.WorkflowRefused` (reason
``workflow_cannot_fit``) and sends :data:`~celery_deadlines.signals.deadline_refused`;
nothing is published and nothing is written to the ledger. ``deadlines_workflow_check``
(``"refuse"``, ``"warn"``: log the arithmetic and publish, ``"off"``) decides.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any, Final

from celery import canvas as celery_canvas
from celery.canvas import Signature, maybe_signature
from celery.utils.functional import _regen  # type: ignore[attr-defined]  # Celery's lazy list

from .. import conf
from ..clock import get_clock
from ..conf import settings_for
from ..rules import stamping, workflows
from ..rules.budgets import capped_seconds
from ..rules.contracts import is_deadline_task
from . import options, publishing
from .propagation import current_task, inherited
from .refusals import report_refusal

logger = logging.getLogger("celery_deadlines")

#: Options of a canvas that reach its first steps and matter to the rule.
_LEADING: Final = frozenset({"countdown", "eta", "headers", *stamping.CALL_OPTIONS})
_MARK: Final = "__celery_deadlines_workflow_gate__"

#: Set while a checked canvas publishes: its nested canvases are part of it.
_inside: ContextVar[bool] = ContextVar("celery_deadlines_workflow", default=False)


class _Built:
    """What building the tree found so far: the first step's task and the deadline it
    would be published with (``None`` until the first step is reached), and whether any
    step is a DeadlineTask."""

    def __init__(self) -> None:
        self.first_task: Any = None
        self.deadline: datetime | None = None
        self.any_deadline_task = False


class _Ungoverned(Exception):
    """The first step would be published with no deadline: there is nothing to judge, and
    the rest of the canvas is left unread (a generator in it stays Celery's to consume)."""


def check(canvas: Signature, call: Mapping[str, Any], kwargs: Any = None) -> None:
    """Refuse (or log) ``canvas`` applied with the options ``call`` when its critical
    path cannot fit the deadline its first step would get. Raises
    :class:`~celery_deadlines.errors.WorkflowRefused`; never publishes anything."""
    app = canvas.app
    settings = settings_for(app)
    mode = settings.get(conf.WORKFLOW_CHECK)
    if mode == "off":
        return
    if not _registers_deadline_task(app):
        return  # no step can be a DeadlineTask: nothing to judge, the canvas is not read
    now = get_clock().now()
    built = _Built()
    lead = {key: value for key, value in call.items() if key in _LEADING}
    body = kwargs.get("body") if isinstance(canvas, celery_canvas.chord) and kwargs else None
    try:
        tree = _node(canvas, app, settings, now, lead, built, body=body)
    except _Ungoverned:
        return  # read up to its first step only: no deadline governs it
    deadline = built.deadline
    if not built.any_deadline_task or deadline is None:
        return
    task = built.first_task
    decision = workflows.fit(tree, deadline, now)
    if decision.allowed:
        return
    name = getattr(task, "name", None) or "workflow"
    if mode == "warn":
        logger.warning(
            "%s: workflow_cannot_fit (deadline %s, clock read %s): %s; published anyway "
            "(deadlines_workflow_check = 'warn')",
            name,
            deadline.isoformat(),
            now.isoformat(),
            decision.detail,
        )
        return
    report_refusal(task, None, name, decision)
    raise decision.refusal()


def _node(
    sig: Any,
    app: Any,
    settings: conf.Settings,
    now: datetime,
    lead: dict[str, Any],
    built: _Built,
    *,
    body: Any = None,
) -> workflows.Node:
    sig = maybe_signature(sig, app=app)
    if not isinstance(sig, Signature):
        return workflows.Group(())  # nothing Celery could publish either: it will say so
    own = {key: value for key, value in (sig.options or {}).items() if key in _LEADING}
    if isinstance(sig, celery_canvas._chain):
        outer = {**own, **lead}
        return workflows.Chain(
            tuple(
                _node(inner, app, settings, now, outer if i == 0 else {}, built)
                for i, inner in enumerate(sig.tasks)
            )
        )
    if isinstance(sig, celery_canvas.group):
        return _group(sig.tasks, app, settings, now, {**own, **lead}, built)
    if isinstance(sig, celery_canvas.chord):
        header = sig.tasks
        outer = {**own, **lead}
        if isinstance(header, celery_canvas.group):
            outer = {**_leading(header.options), **outer}
            header = header.tasks
        return workflows.Chord(
            _group(header, app, settings, now, outer, built),
            _node(body if body is not None else sig.body, app, settings, now, {}, built),
        )
    return _step(sig, app, settings, now, {**own, **lead}, built)


def _group(
    members: Any, app: Any, settings: conf.Settings, now: datetime, lead: dict[str, Any], b: _Built
) -> workflows.Group:
    # read member by member: the walk may stop at the first step
    members = () if members is None else members
    if isinstance(members, _regen):
        # a generator (Celery keeps it as a regen) is published as it yields
        # (celery#3021): the gate reads its first member, which Celery reads before
        # its first publish anyway, and judges the group by it alone (a lower bound of
        # its need); every member is judged by its own enqueue gate as it is published
        first = next(iter(members), None)
        return workflows.Group(
            () if first is None else (_node(first, app, settings, now, lead, b),)
        )
    return workflows.Group(tuple(_node(m, app, settings, now, lead, b) for m in members))


def _step(
    sig: Signature,
    app: Any,
    settings: conf.Settings,
    now: datetime,
    given: dict[str, Any],
    built: _Built,
) -> workflows.Step:
    name = str(sig.task)
    task = app.tasks.get(name)
    if built.deadline is None:  # the first step: its deadline governs the workflow
        built.first_task = task
        built.deadline = _governing(task, given, now, settings)
        if built.deadline is None:
            raise _Ungoverned
    starts_at = options.start_of(given, now)
    countdown = max(starts_at - now, workflows.ZERO) if starts_at is not None else workflows.ZERO
    if not is_deadline_task(task):
        return workflows.Step(name, None, workflows.ZERO, countdown)
    built.any_deadline_task = True
    contract = settings.contract_of(name)
    timeout: timedelta | None = options.duration(
        task, "attempt_timeout", settings, contract=contract
    )
    limit = _time_limit(sig.options or {})
    if limit is not None and (not timeout or limit < timeout):
        timeout = limit
    reserve = options.duration(task, "reserve", settings, contract=contract)
    return workflows.Step(name, timeout or None, reserve, countdown)


def _registers_deadline_task(app: Any) -> bool:
    """Does ``app`` register a DeadlineTask? Every step is looked up in its canvas's app:
    without one, no step of it is a DeadlineTask."""
    return any(is_deadline_task(task) for task in app.tasks.values())


def _time_limit(given: Mapping[str, Any]) -> timedelta | None:
    """A signature's ``time_limit`` (Celery's call option) as a duration, if it has one."""
    raw = given.get("time_limit")
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw > 0:
        return capped_seconds(raw)
    return None


def _leading(given: Mapping[str, Any] | None) -> dict[str, Any]:
    return {key: value for key, value in (given or {}).items() if key in _LEADING}


def _governing(
    task: Any, given: dict[str, Any], now: datetime, settings: conf.Settings
) -> datetime | None:
    """The deadline the first step would be published with, by the rule every publish is
    stamped by (:func:`publishing.stamp`): a DeadlineTask's as its ``apply_async`` would
    stamp it, a plain step's as the publish hook would (``None``: no deadline, or its
    parent's is unreadable: the step's own enqueue gate refuses that). Logs nothing."""
    call = dict(given)  # the stamp takes this package's options out of the call
    headers = dict(call.get("headers") or {})
    if is_deadline_task(task):
        parent = publishing.inherited_by(task)
        if parent.unreadable is not None:
            return None
        stamp = publishing.stamp(
            task,
            call,
            headers,
            now=now,
            parent=parent,
            task_id=None,
            times=options.times(task, settings),
        )
    else:
        stamp = publishing.stamp(
            None,
            call,
            headers,
            now=now,
            parent=inherited(),
            task_id=None,
            horizon=settings.max_budget,
            expires=call.get("expires"),
        )
    return None if stamp is None else stamp.governed.deadline


@contextmanager
def _publishing() -> Iterator[None]:
    token = _inside.set(True)
    try:
        yield
    finally:
        _inside.reset(token)


def _later_hop(canvas: Signature, call: Mapping[str, Any]) -> bool:
    """Is ``canvas`` the next part of a workflow already under way, published by a
    worker? The rest of a chain (Celery's tracer passes it as ``chain=``), a chord's body
    (published by the header task that completed the chord, whose request names it as
    its ``chord``, or by ``celery.chord_unlock``). Checked once, at the enqueue."""
    if "chain" in call:
        return True
    task = current_task()
    if task is None:
        return False
    if task.name == "celery.chord_unlock":
        return True
    body = getattr(task.request, "chord", None)
    if not isinstance(body, Mapping):
        return False
    # the ids frozen into the body (Celery 5.5 freezes a chain's tasks, not the chain)
    return bool(_frozen_ids(canvas) & _frozen_ids(body))


def _frozen_ids(sig: Mapping[str, Any]) -> set[str]:
    """The task ids frozen into a signature and the signatures it holds."""
    found: set[str] = set()
    own = (sig.get("options") or {}).get("task_id")
    if isinstance(own, str):
        found.add(own)
    kwargs = sig.get("kwargs") or {}
    members = kwargs.get("tasks") if isinstance(kwargs, Mapping) else None
    for member in members if isinstance(members, (list, tuple)) else ():
        if isinstance(member, Mapping):
            found |= _frozen_ids(member)
    return found


def _gated(original: Callable[..., Any]) -> Callable[..., Any]:
    def apply_async(self: Signature, *args: Any, **call: Any) -> Any:
        if _inside.get() or _later_hop(self, call):
            return original(self, *args, **call)
        with _publishing():
            kwargs = args[1] if len(args) > 1 else call.get("kwargs")
            check(self, {**(self.options or {}), **call}, kwargs)
            return original(self, *args, **call)

    apply_async.__name__ = original.__name__
    apply_async.__qualname__ = original.__qualname__
    apply_async.__doc__ = original.__doc__
    apply_async.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(apply_async, _MARK, True)
    return apply_async


#: The classes whose ``apply_async`` is gated.
CLASSES: Final = (celery_canvas._chain, celery_canvas.group, celery_canvas.chord)


def patch() -> None:
    """Gate ``apply_async`` of Celery's chain, group and chord (once per process)."""
    for cls in CLASSES:
        current = cls.__dict__["apply_async"]
        # only Celery's own method: one a test replaced (a Mock) is left as it is
        if inspect.isfunction(current) and not getattr(current, _MARK, False):
            cls.apply_async = _gated(current)  # type: ignore[method-assign]


def unpatch() -> None:
    """Give Celery's canvas classes their own ``apply_async`` back."""
    for cls in CLASSES:
        current = cls.__dict__["apply_async"]
        if getattr(current, _MARK, False):
            cls.apply_async = current.__wrapped__  # type: ignore[method-assign]


def patched() -> bool:
    """Is the workflow gate in place?"""
    return all(getattr(cls.__dict__["apply_async"], _MARK, False) for cls in CLASSES)
