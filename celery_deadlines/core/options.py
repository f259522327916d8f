"""A DeadlineTask's durations, each from the one precedence rule (:func:`resolve`).

::

    task attribute  >  time contract  >  (other task attributes)  >  per-task setting
    >  default setting

(The other task attributes: ``attempt_timeout`` falls back to a ``time_limit``, then a
``soft_time_limit``, declared on the task itself; never to the app's
``task_time_limit``, which Celery 5.7 copies onto a task that declares none.)

Call options (``apply_async(budget=...)``) come first and are read where the call is
(:mod:`celery_deadlines.core.propagation`). :data:`OPTIONS` lists, for each duration, where
it may be said; :func:`resolve` walks that list. A task attribute is parsed once per
value (attributes rarely change, and this runs at every publish and claim).
:func:`own_deadlines` turns them into a publish's own deadlines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, NamedTuple

from celery.utils.time import maybe_make_aware

from .. import conf
from ..errors import InvalidDeadline
from ..rules import stamping, wire
from ..rules.budgets import UNSET, Source, capped_seconds, parse_budget, parse_duration
from ..rules.gates import TICK
from ..rules.limits import TASK_LIMITS, own_limit

Parse = Callable[[object, str, "conf.Settings"], "timedelta | None"]


def _budget(raw: object, name: str, settings: conf.Settings) -> timedelta | None:
    return parse_budget(raw, name=name, maximum=settings.max_budget)


def _reserve(raw: object, name: str, settings: conf.Settings) -> timedelta | None:
    return parse_duration(raw, name=name, allow_zero=True) if raw is not None else None


def _duration(raw: object, name: str, settings: conf.Settings) -> timedelta | None:
    return parse_duration(raw, name=name)


@dataclass(frozen=True)
class Option:
    """Where one duration may be said, highest first after the task attribute."""

    parse: Parse
    #: the per-task setting (``{task name: value}``), if there is one
    per_task: conf.Setting[dict[str, timedelta | None]] | None
    default: conf.Setting[Any]
    #: Celery task attributes asked after the contract (``time_limit``, ...)
    then_attributes: tuple[str, ...] = ()
    #: what "nothing said anywhere" means
    otherwise: timedelta | None = None


OPTIONS: Final[dict[str, Option]] = {
    "budget": Option(_budget, conf.BUDGETS, conf.DEFAULT_BUDGET),
    "delivery_budget": Option(_budget, None, conf.DEFAULT_DELIVERY_BUDGET),
    "reserve": Option(_reserve, None, conf.DEFAULT_RESERVE, otherwise=timedelta(0)),
    "lease_ttl": Option(_duration, None, conf.LEASE_TTL),
    "attempt_timeout": Option(
        _duration,
        None,
        conf.DEFAULT_ATTEMPT_TIMEOUT,
        ("time_limit", "soft_time_limit"),
        otherwise=timedelta(0),
    ),
}


#: "look the task's contract up" (a caller that needs several durations passes it)
LOOKUP: Final = object()


def resolve(
    task: Any, name: str, settings: conf.Settings, *, contract: Any = LOOKUP
) -> tuple[Source | None, Any]:
    """``(source, duration)`` of the duration ``name`` for ``task``: the first level that
    says anything (``None``, "no deadline", included) of its attribute, its contract's,
    the Celery attributes after it, the per-task setting, the default. Lower levels are
    not read once one has answered (this runs at every publish and claim). ``contract``:
    the task's :class:`~celery_deadlines.rules.contracts.TimeContract` or ``None``, when the
    caller already read it (``settings.contract_of(task.name)``)."""
    option = OPTIONS[name]
    # flat on purpose, with the common "attribute not set" test inline: this runs
    # several times at every publish
    source: Source = "task"
    said = getattr(task, name, UNSET)
    if said is not UNSET:
        said = _attribute(task, name, option, settings)
    if said is UNSET:
        if contract is LOOKUP:
            contract = settings.contract_of(task.name)
        source = "setting"
        if contract is None or (said := getattr(contract, name)) is UNSET:
            source, said = "task", UNSET
            for other in option.then_attributes:
                if (said := _attribute(task, other, option, settings)) is not UNSET:
                    break
        if said is UNSET and option.per_task is not None:
            source, said = "setting", settings.get(option.per_task).get(task.name, UNSET)
        if said is UNSET:
            source, said = "default", settings.get(option.default)
    # "nothing said" (None) means no deadline, or the option's neutral value
    return source, option.otherwise if said is None and option.otherwise is not None else said


def duration(task: Any, name: str, settings: conf.Settings, *, contract: Any = LOOKUP) -> timedelta:
    """A duration that always has a value (reserve, lease, attempt timeout)."""
    value = resolve(task, name, settings, contract=contract)[1]
    if value is None:
        raise ValueError(f"{task.name}.{name} has no value")
    return value  # type: ignore[no-any-return]


def _attribute(task: Any, attribute: str, option: Option, settings: conf.Settings) -> object:
    """The task attribute, parsed (once per value), or UNSET when it says nothing."""
    raw = getattr(task, attribute, UNSET)
    if raw is UNSET or (raw is None and option.then_attributes):
        return UNSET  # Celery's time_limit=None means "no limit", not "no deadline"
    if attribute in _CELERY_LIMITS and own_limit(task, attribute) is None:
        # the app's task_time_limit, which Celery 5.7 copies onto every task that
        # declares none: a safety cap for the whole app, not what one attempt takes
        return UNSET
    cache: dict[str, tuple[object, object]] | None = getattr(task, _PARSED, None)
    if cache is None:
        cache = {}
        setattr(task, _PARSED, cache)
    cached = cache.get(attribute)
    if cached is not None and cached[0] is raw:
        return cached[1]
    parsed = option.parse(raw, f"{task.name}.{attribute}", settings)
    cache[attribute] = (raw, parsed)
    return parsed


#: A task's Celery time limits, which say its attempt timeout when declared on the task.
_CELERY_LIMITS: Final = frozenset(TASK_LIMITS)

#: The durations a :class:`Times` keeps: each is said by a task attribute of its name
#: first, and by no other attribute (``attempt_timeout`` falls back to ``time_limit``).
_KEPT: Final = ("budget", "delivery_budget", "reserve")
#: The task attribute a task's :class:`Times` is kept in.
_TIMES: Final = "_celery_deadlines_times"
#: The task attribute its parsed duration attributes are kept in, by name.
_PARSED: Final = "_celery_deadlines_parsed"

# Each is read and written as an attribute, never through ``task.__dict__``: asking for
# an object's ``__dict__`` turns its attributes into a dict for good, and every later
# read of an attribute of the task (Celery's, at every message) then costs more.


class Times:
    """A task's budget, delivery budget and reserve, its time contract and the horizon
    (``deadlines_max_budget``), each worked out from the settings when first asked for.

    Every publish, claim gate and attempt gate asks for some of them; working them out
    through :func:`resolve` cost more than the rest of what this package does there.
    :func:`times` keeps one per task for as long as the settings' stamp
    (:meth:`conf.Settings.stamp`) and the task's attributes of those names stay the same.
    """

    __slots__ = ("_contract", "_horizon", "_resolved", "attributes", "settings", "stamp", "task")

    def __init__(
        self, task: Any, settings: conf.Settings, stamp: object, attributes: tuple[object, ...]
    ) -> None:
        self.task = task
        self.settings = settings
        self.stamp = stamp
        self.attributes = attributes
        self._contract: Any = LOOKUP
        self._horizon: timedelta | None = None
        self._resolved: dict[str, tuple[Source | None, Any]] = {}

    @property
    def contract(self) -> Any:
        """The task's :class:`~celery_deadlines.rules.contracts.TimeContract`, or ``None``."""
        if self._contract is LOOKUP:
            self._contract = self.settings.contract_of(self.task.name)
        return self._contract

    @property
    def horizon(self) -> timedelta:
        """``deadlines_max_budget``: how far ahead a deadline may be."""
        horizon = self._horizon
        if horizon is None:
            horizon = self._horizon = self.settings.max_budget
        return horizon

    def resolve(self, name: str) -> tuple[Source | None, Any]:
        """:func:`resolve` of ``budget``, ``delivery_budget`` or ``reserve``."""
        resolved = self._resolved.get(name)
        if resolved is None:
            if name not in _KEPT:
                raise ValueError(f"{name} is not one of {_KEPT}")
            resolved = resolve(self.task, name, self.settings, contract=self.contract)
            self._resolved[name] = resolved
        return resolved

    def name_nothing(self, call: Mapping[str, Any]) -> bool:
        """Whether a publish with the call options ``call`` has no deadline of its own:
        the task has neither a budget nor a delivery budget (``None`` said everywhere),
        and the call names none (no option of this package's, no explicit header)."""
        given = call.get("headers")
        return (
            self.resolve("budget")[1] is None
            and self.resolve("delivery_budget")[1] is None
            and stamping.CALL_OPTIONS.isdisjoint(call)
            and not (given and wire.DEADLINE_HEADER in given)
        )

    def duration(self, name: str) -> timedelta:
        """:func:`duration` of ``reserve`` (a duration that always has a value)."""
        value = self.resolve(name)[1]
        if value is None:
            raise ValueError(f"{self.task.name}.{name} has no value")
        return value  # type: ignore[no-any-return]


def times(task: Any, settings: conf.Settings) -> Times:
    """``task``'s :class:`Times` under ``settings``: the one kept on the task while the
    settings' stamp and the task's ``budget``, ``delivery_budget`` and ``reserve``
    attributes are what they were, else a new one, kept in its place."""
    kept: Times | None = getattr(task, _TIMES, None)
    stamp = settings.stamp()
    # one condition, its cheapest parts first: this runs for every message a worker
    # takes, in both of its processes, and every publish
    if (
        kept is not None
        and kept.settings is settings
        and kept.stamp == stamp
        and kept.attributes[0] is getattr(task, "budget", UNSET)
        and kept.attributes[1] is getattr(task, "delivery_budget", UNSET)
        and kept.attributes[2] is getattr(task, "reserve", UNSET)
    ):
        return kept
    attributes = (
        getattr(task, "budget", UNSET),
        getattr(task, "delivery_budget", UNSET),
        getattr(task, "reserve", UNSET),
    )
    fresh = Times(task, settings, stamp, attributes)
    setattr(task, _TIMES, fresh)
    return fresh


# -- the same, in the wire's unit: what the shortcuts of the gates compare -------------
#
# A deadline header as this package writes it is a float of epoch seconds, and so is the
# clock's own reading (celery_deadlines.clock.epoch): comparing the two is the inherent
# cost of a gate, and building the datetimes the full rule compares costs more than the
# rest of it. Each shortcut (the claim gate's, in core/request.py; the attempt gate's, in
# core/starting.py; the stamp's, in core/publishing.py) sits beside the rule it
# shortcuts and decides only what that rule would; tests/unit/core/test_fast_paths.py holds
# each to it.

#: How clearly in time (seconds) a deadline header must be for a gate to admit it in
#: epoch seconds (:class:`InSeconds`): a float cannot tell apart two instants a
#: microsecond apart so far from 1970, and a message this close to its last start, or to
#: the horizon, is judged with datetimes.
EDGE: Final = 0.001


class InSeconds(NamedTuple):
    """What a worker's gates compare a deadline header with, in the wire's unit (epoch
    seconds), worked out once per task and settings (:func:`limits_of`): a message
    whose deadline is more than ``low`` and less than ``high`` seconds ahead is clearly
    in time (its last start, the deadline less the reserve, is more than :data:`EDGE`
    ahead, and it is within the horizon by more than that); any other is judged with
    datetimes, by the full rule."""

    #: the task's reserve (at least :data:`~celery_deadlines.rules.gates.TICK`) + EDGE
    low: float
    #: ``deadlines_max_budget`` - EDGE
    high: float
    #: ``deadlines_max_budget``, what a header's deadline is read against
    horizon: timedelta
    #: whether deadlines are judged by the worker's own clock (no clock-skew budget:
    #: with one, the ledger's clock decides, as the clock watch estimates it)
    local: bool
    #: the task's budget in seconds, ``None`` for none, and where it is said, when a
    #: publish that names nothing of its own may be stamped with it in epoch seconds
    #: (it is longer than the reserve by more than EDGE, and there is no delivery
    #: budget): else ``None``, and such a publish is stamped by the full rule
    budget: float | None
    budget_source: Source | None
    #: whether the task says no budget and no delivery budget anywhere: a publish that
    #: names nothing of its own and inherits nothing is Celery's own message
    names_nothing: bool


#: The task attribute a task's :class:`InSeconds` is kept in, with what it came from.
_IN_SECONDS: Final = "_celery_deadlines_in_seconds"


def in_seconds(task: Any, settings: conf.Settings) -> InSeconds:
    """``task``'s :class:`InSeconds` under ``settings``: kept on the task, as its
    :class:`Times` is, while the settings' stamp and the
    task's ``budget``, ``delivery_budget`` and ``reserve`` attributes are what they
    were."""
    kept: tuple[conf.Settings, object, tuple[object, ...], InSeconds] | None = getattr(
        task, _IN_SECONDS, None
    )
    stamp = settings.stamp()
    if kept is not None and kept[0] is settings and kept[1] == stamp:
        attributes = kept[2]
        if (
            attributes[0] is getattr(task, "budget", UNSET)
            and attributes[1] is getattr(task, "delivery_budget", UNSET)
            and attributes[2] is getattr(task, "reserve", UNSET)
        ):
            return kept[3]
    resolved = times(task, settings)
    horizon = resolved.horizon
    reserve = max(resolved.duration("reserve"), TICK).total_seconds()
    source, budget = resolved.resolve("budget")
    delivery = resolved.resolve("delivery_budget")[1]
    stamps_in_seconds = (
        budget is not None and delivery is None and budget.total_seconds() > reserve + EDGE
    )
    found = InSeconds(
        reserve + EDGE,
        horizon.total_seconds() - EDGE,
        horizon,
        settings.get(conf.CLOCK_SKEW_BUDGET) is None,
        budget.total_seconds() if stamps_in_seconds else None,
        source if stamps_in_seconds else None,
        budget is None and delivery is None,
    )
    setattr(task, _IN_SECONDS, (settings, stamp, resolved.attributes, found))
    return found


def own_deadlines(
    task: Any,
    call: dict[str, Any],
    headers: dict[str, Any],
    now: datetime,
    times: Times,
) -> stamping.Own:
    """A publish's own deadlines: the call's options, else an explicit header (or the one
    ``retry()`` copied), else the task's configured budgets (``times``: the task's
    :class:`Times`, from the caller)."""
    if not stamping.CALL_OPTIONS.isdisjoint(call) or wire.DEADLINE_HEADER in headers:
        deadline, source, delivery = stamping.own_deadlines(call, headers, now, times.horizon)
    else:
        deadline = source = delivery = None
    if deadline is None:
        source, budget = times.resolve("budget")
        deadline = None if budget is None else now + budget
    if delivery is None:
        delivery_budget = times.resolve("delivery_budget")[1]
        delivery = None if delivery_budget is None else now + delivery_budget
    if deadline is None and delivery is None:
        return stamping.NO_OWN  # one object: the caller recognises "nothing" by identity
    return stamping.Own(deadline, source if deadline is not None else None, delivery)


def start_of(call: Mapping[str, Any], now: datetime) -> datetime | None:
    """When a message may first start: its ``eta`` or ``countdown``, else ``None``."""
    eta = call.get("eta")
    if isinstance(eta, datetime):
        aware: datetime = maybe_make_aware(eta)  # as Celery reads a naive eta
        return aware
    countdown = call.get("countdown")
    if isinstance(countdown, (int, float)) and not isinstance(countdown, bool):
        wait = capped_seconds(countdown)  # longer than a century: after any deadline
        if wait is None:
            raise InvalidDeadline(f"countdown must be a number of seconds, got {countdown}")
        return now + wait
    return None
