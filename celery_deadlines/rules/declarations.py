"""What tasks declare, reviewed before anything is published: the Django system checks'
rules for task options and the settings that only make sense with them.

A DeadlineTask's options (``@app.task(base=DeadlineTask, budget=30, ...)``) are read at
its first publish or claim, not at import: a bad one (``budget=-3``), a pair that cannot
work (``reserve`` eating the budget), a misspelled one (``budgte=10``, which Celery keeps
as a class attribute, so the task silently has the default) would otherwise be found by
the first caller, or never. :func:`review` finds them from the task registry and the
settings' values, as :class:`Configured` (each already parsed, or :data:`UNKNOWN` when it
is itself bad: ``check_settings`` reports that, once). Settings that cannot work together
or are too wide to be meant are reviewed here too, without the tasks
(:func:`review_settings`).

A task's durations are resolved with the precedence of
:func:`celery_deadlines.core.options.resolve` (task option > contract > ``time_limit`` for the
attempt > per-task setting > default), read here from plain values, since this module is
pure: ``tests/unit/rules/test_declarations.py`` holds the two equal. Nothing here reads the
clock, Django or Celery; a task is anything with the attributes Celery gives one.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final, Literal, TypeAlias, TypeVar

from ..errors import InvalidDeadline
from .budgets import UNSET, parse_duration
from .contracts import TimeContract, is_deadline_task
from .incoming import Network
from .limits import TASK_LIMITS, own_limit
from .quoting import shown


class _Unknown(enum.Enum):
    UNKNOWN = "UNKNOWN"

    def __repr__(self) -> str:
        return "UNKNOWN"


#: "This setting's value is bad (reported as such elsewhere): check nothing against it."
UNKNOWN: Final = _Unknown.UNKNOWN
Unknown: TypeAlias = Literal[_Unknown.UNKNOWN]

T = TypeVar("T")
#: A setting's parsed value, or :data:`UNKNOWN`.
Known: TypeAlias = T | Unknown

#: The options a DeadlineTask reads from its class (docs/reference/settings.md, "Task options").
TASK_OPTIONS: Final = (
    "budget",
    "delivery_budget",
    "reserve",
    "attempt_timeout",
    "lease_ttl",
    "deadline_kind",
    "reconcilers",
)
#: The task options that are durations, in the order they are reviewed.
DURATIONS: Final = ("budget", "delivery_budget", "reserve", "attempt_timeout", "lease_ttl")

#: The widest network a proxy list may hold without being a mistake: the largest private
#: network of each family (10.0.0.0/8, fc00::/7). No proxy fleet needs more addresses,
#: and a wider one trusts strangers' headers; ``/0`` trusts every client.
WIDEST_TRUSTED_PREFIX: Final = {4: 8, 6: 7}

SETTINGS_REFERENCE: Final = "Settings reference"
TASK_OPTIONS_SECTION: Final = (SETTINGS_REFERENCE, "Task options")


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding: ``id`` (``celery_deadlines.E006``), a message naming the task and
    the option or the setting, a hint saying the fix, and where the docs say more
    (``read``: a page title and one of its headings, or a setting's Django name)."""

    severity: Literal["error", "warning"]
    id: str
    message: str
    hint: str
    read: tuple[str, str]


@dataclass(frozen=True, slots=True)
class Configured:
    """The settings declarations are checked against, parsed; :data:`UNKNOWN` for one
    whose value is bad. ``name`` spells a setting's Celery name as messages show it
    (``CELERY_DEADLINES_BUDGETS`` for a Django project)."""

    default_budget: Known[timedelta | None] = None
    budgets: Known[Mapping[str, timedelta | None]] = field(default_factory=dict)
    contracts: Known[Mapping[str, TimeContract]] = field(default_factory=dict)
    default_reserve: Known[timedelta] = timedelta(0)
    default_attempt_timeout: Known[timedelta | None] = None
    max_budget: Known[timedelta] = timedelta(days=7)
    lease_ttl: Known[timedelta] = timedelta(seconds=30)
    #: whether the project set ``deadlines_lease_ttl``: the package's default lease is
    #: longer than many budgets, by design, and is no mistake of the project's
    lease_ttl_set: bool = True
    #: whether runs are recorded in the ledger, where leases are (``deadlines_ledger``)
    ledger: Known[bool] = True
    trusted_proxies: Known[Sequence[Network]] = ()
    name: Callable[[str], str] = field(default=lambda setting: setting)


# -- the review ------------------------------------------------------------------------------


def review(
    tasks: Mapping[str, Any], configured: Configured, *, known_attributes: Collection[str]
) -> list[Problem]:
    """Every problem of the DeadlineTasks in ``tasks`` (the Celery app's registry) and
    of the settings that name tasks (``deadlines_budgets``). ``known_attributes``: the
    attribute names of Celery's ``Task`` and of ``DeadlineTask`` (and Celery's own task
    options it keeps only on the class), which are never a misspelled option."""
    problems: list[Problem] = []
    for name, task in tasks.items():
        if is_deadline_task(task):
            problems += _task_problems(name, task, configured, known_attributes)
    problems += _budgets_entries(tasks, configured)
    return problems


def review_settings(configured: Configured) -> list[Problem]:
    """Settings that cannot work together, or are too wide to be meant; no task needed."""
    return [*_defaults_that_do_not_fit(configured), *_too_wide_proxies(configured)]


def _task_problems(
    name: str, task: Any, configured: Configured, known_attributes: Collection[str]
) -> Iterator[Problem]:
    resolved = Resolved(name, task, configured)
    for option, error in resolved.bad.items():
        yield _bad_option(option, error, configured)
    yield from _longer_than_the_maximum(name, resolved.good, configured)
    yield from _misspelled(name, task, known_attributes)
    # a bad option (E006) has no value: the fit checks below leave out what needs it
    yield from _does_not_fit(name, resolved)
    yield from _lease_longer_than_budget(name, resolved, configured)


# -- 1. a bad value (E006) ---------------------------------------------------------------------

_HOW_TO_SAY: Final = {
    "budget": "seconds above zero or a timedelta (at most {deadlines_max_budget}), "
    "or None for no deadline",
    "delivery_budget": "seconds above zero or a timedelta, or None for no delivery deadline",
    "reserve": "seconds (zero or more) or a timedelta",
    "attempt_timeout": "seconds above zero or a timedelta, or None to use time_limit",
    "lease_ttl": "seconds above zero or a timedelta (leave it out for {deadlines_lease_ttl})",
}


def _parse_option(option: str, raw: object, label: str) -> timedelta | None:
    """A task option's value as :mod:`celery_deadlines.core.options` parses it (the maximum
    budget aside: :func:`_longer_than_the_maximum` says that one), or
    :class:`InvalidDeadline`."""
    if raw is None and option != "lease_ttl":
        return None  # no deadline; no reserve; attempt_timeout: ask time_limit
    return parse_duration(raw, name=label, allow_zero=option == "reserve")


#: Where a bad option is first read, and raises :class:`InvalidDeadline`.
_READ_AT: Final = {
    "budget": "every publish of the task",
    "delivery_budget": "every publish of the task",
    "reserve": "every publish (with a deadline) and every claim of the task",
    "attempt_timeout": "every retry of the task, and every workflow holding it,",
    "lease_ttl": "every claim of the task, in the worker",
}


def _bad_option(option: str, error: str, configured: Configured) -> Problem:
    how = _HOW_TO_SAY[option].format_map(
        {
            setting: configured.name(setting)
            for setting in ("deadlines_max_budget", "deadlines_lease_ttl")
        }
    )
    return Problem(
        "error",
        "celery_deadlines.E006",
        f"{error}: {_READ_AT[option]} would raise InvalidDeadline.",
        f"Give {option} as {how}.",
        TASK_OPTIONS_SECTION,
    )


# -- 6. a declared budget the maximum refuses (E009) -------------------------------------------


def _longer_than_the_maximum(
    task: str, good: Mapping[str, timedelta | None], configured: Configured
) -> Iterator[Problem]:
    maximum = configured.max_budget
    if maximum is UNKNOWN:
        return
    setting = configured.name("deadlines_max_budget")
    for option in ("budget", "delivery_budget"):
        value = good.get(option)
        if value is not None and value > maximum:
            yield Problem(
                "error",
                "celery_deadlines.E009",
                f"task {shown(task)} option {option} ({_s(value)}) is longer than {setting} "
                f"({_s(maximum)}): the task can never be published.",
                f"Shorten the task's {option}, or raise {setting} if runs that long are meant.",
                (SETTINGS_REFERENCE, setting),
            )


# -- 3. a misspelled option (W006) -------------------------------------------------------------


def _misspelled(task: str, instance: Any, known_attributes: Collection[str]) -> Iterator[Problem]:
    """Attributes the task's own classes (or the task itself) set that no Celery or
    DeadlineTask attribute has, spelled like one of this package's options: Celery keeps
    an unknown task option as a class attribute, so the option meant stays its default.
    Methods and private names are the task's own code, never an option."""
    seen: dict[str, object] = {}
    for owner in (instance, *type(instance).__mro__):
        for attribute, value in vars(owner).items():
            seen.setdefault(attribute, value)
    for attribute, value in sorted(seen.items()):
        if (
            attribute.startswith("_")
            or attribute in known_attributes
            or callable(value)
            or isinstance(value, (property, classmethod, staticmethod))
        ):
            continue
        closest = difflib.get_close_matches(attribute, TASK_OPTIONS, n=1)
        if closest:
            yield Problem(
                "warning",
                "celery_deadlines.W006",
                f"task {shown(task)} has the attribute {attribute} = {shown(value, 60)}, which "
                f"is not a task option; did you mean {closest[0]}? As spelled it changes nothing: "
                f"the task's {closest[0]} is its default.",
                f"Rename the option {attribute} to {closest[0]} (or rename your attribute "
                "if it is your own).",
                TASK_OPTIONS_SECTION,
            )


# -- the task's durations, resolved ------------------------------------------------------------

#: Where a duration came from, as a message names it.
Said: TypeAlias = tuple[str, "timedelta | None"]
_TASK: Final = "task option"
#: Celery's options an attempt timeout falls back to, in order (``options.OPTIONS``).
_TIME_LIMITS: Final = TASK_LIMITS


class Resolved:
    """The task ``name``'s duration options, parsed (``good``; ``bad``: the error of each
    bad one), and its budget, reserve, attempt timeout and lease as a publish would
    resolve them (:func:`celery_deadlines.core.options.resolve`): each method answers
    ``(where, value)``, or ``None`` when a level it asks is unreadable (a bad option or
    setting). ``value`` ``None`` is "no deadline" for the budget, "not set" for the
    attempt timeout."""

    def __init__(self, name: str, task: Any, configured: Configured) -> None:
        self.name, self.task, self.configured = name, task, configured
        self.declared = {option: getattr(task, option, UNSET) for option in DURATIONS}
        self.good: dict[str, timedelta | None] = {}
        self.bad: dict[str, str] = {}
        for option, raw in self.declared.items():
            if raw is UNSET:
                continue
            try:
                self.good[option] = _parse_option(
                    option, raw, f"task {shown(name)} option {option}"
                )
            except InvalidDeadline as error:
                self.bad[option] = str(error)
        contracts = configured.contracts
        self.contract: TimeContract | Unknown | None = (
            UNKNOWN if contracts is UNKNOWN else contracts.get(name)
        )

    def _own(self, option: str) -> Said | Unknown | None:
        """The task option: ``None`` when not said, :data:`UNKNOWN` when bad."""
        if self.declared[option] is UNSET:
            return None
        if option not in self.good:
            return UNKNOWN
        return (_TASK, self.good[option])

    def _contract(self, option: str) -> Said | Unknown | None:
        contract = self.contract
        if contract is UNKNOWN:
            return UNKNOWN
        value = UNSET if contract is None else getattr(contract, option)
        if value is UNSET:
            return None
        return (self.configured.name("deadlines_contracts"), value)

    def _setting(self, setting: str, value: Known[timedelta | None]) -> Said | Unknown:
        return UNKNOWN if value is UNKNOWN else (self.configured.name(setting), value)

    def budget(self) -> Said | None:
        own = self._own("budget")
        if own is None:
            own = self._contract("budget")
        if own is None:
            budgets = self.configured.budgets
            if budgets is UNKNOWN:
                return None
            if self.name in budgets:
                own = (self.configured.name("deadlines_budgets"), budgets[self.name])
        if own is None:
            own = self._setting("deadlines_default_budget", self.configured.default_budget)
        return None if own is UNKNOWN else own

    def reserve(self) -> Said | None:
        own = self._own("reserve")
        if own is None:
            own = self._contract("reserve")
        if own is None:
            own = self._setting("deadlines_default_reserve", self.configured.default_reserve)
        if own is UNKNOWN:
            return None
        return (own[0], timedelta(0) if own[1] is None else own[1])

    def attempt_timeout(self) -> Said | None:
        own = self._own("attempt_timeout")
        if own is not None and own is not UNKNOWN and own[1] is None:
            own = None  # attempt_timeout=None: ask time_limit, as options.resolve does
        if own is None:
            own = self._contract("attempt_timeout")
        for limit in _TIME_LIMITS:
            if own is None:
                own = self._time_limit(limit)
        if own is None:
            own = self._setting(
                "deadlines_default_attempt_timeout", self.configured.default_attempt_timeout
            )
        return None if own is UNKNOWN else own

    def _time_limit(self, limit: str) -> Said | Unknown | None:
        raw = own_limit(self.task, limit)  # never the app's, which Celery 5.7 copies in
        if raw is None:
            return None
        try:
            return (limit, parse_duration(raw, name=limit))
        except InvalidDeadline:
            return UNKNOWN  # Celery's own option, not reviewed here

    def lease_ttl(self) -> Said | None:
        own = self._own("lease_ttl")
        if own is None:
            own = self._contract("lease_ttl")
        if own is None:
            own = self._setting("deadlines_lease_ttl", self.configured.lease_ttl)
        return None if own is UNKNOWN else own


def _said_elsewhere(one: str, other: str, configured: Configured) -> bool:
    """Whether a pair's mismatch is another check's to report: both from the contract
    (``E001``: a contract is checked whole), or both from the default settings
    (:func:`review_settings`, once, not for every task)."""
    contracts = configured.name("deadlines_contracts")
    if one == other == contracts:
        return True
    defaults = {
        configured.name(setting)
        for setting in (
            "deadlines_default_budget",
            "deadlines_default_reserve",
            "deadlines_default_attempt_timeout",
            "deadlines_lease_ttl",
        )
    }
    return one in defaults and other in defaults


# -- 2. a reserve or attempt timeout that does not fit the budget (E007) -----------------------


def _does_not_fit(task: str, resolved: Resolved) -> Iterator[Problem]:
    budget = resolved.budget()
    if budget is None:
        return  # not known
    where_budget, length = budget
    if length is None:
        return  # no deadline: nothing to fit in
    configured = resolved.configured
    reserve = resolved.reserve()
    if reserve is not None:
        where, value = reserve
        if (
            value is not None
            and value >= length
            and not _said_elsewhere(where, where_budget, configured)
        ):
            yield Problem(
                "error",
                "celery_deadlines.E007",
                f"task {shown(task)}: its reserve ({_s(value)}, {where}) leaves nothing of its "
                f"budget ({_s(length)}, {where_budget}): every run would be refused before "
                "it starts.",
                "Make the reserve (the least time a start needs) shorter than the budget, "
                "or the budget longer.",
                TASK_OPTIONS_SECTION,
            )
    attempt = resolved.attempt_timeout()
    if attempt is not None:
        where, value = attempt
        if (
            value is not None
            and value > length
            and not _said_elsewhere(where, where_budget, configured)
        ):
            named = where if where in _TIME_LIMITS else "attempt_timeout"
            yield Problem(
                "error",
                "celery_deadlines.E007",
                f"task {shown(task)}: its attempt_timeout ({_s(value)}, {where}) is longer than "
                f"its budget ({_s(length)}, {where_budget}): no attempt could finish in "
                "time, and every retry would be refused.",
                f"Make {named} at most the budget (what one attempt may take), or the "
                "budget longer.",
                TASK_OPTIONS_SECTION,
            )


# -- 7. a lease longer than the budget (W009) --------------------------------------------------


def _lease_longer_than_budget(
    task: str, resolved: Resolved, configured: Configured
) -> Iterator[Problem]:
    """A lease is capped at the deadline (claim and renewal), so nothing breaks; but a
    lease as long as the budget means a run whose worker dies is never taken over (it
    expires), and a claim or a last write that meets an unreachable database waits up
    to a lease (four, for the last write) for a run long dead."""
    if configured.ledger is not True:
        return  # no ledger, no lease
    budget, lease = resolved.budget(), resolved.lease_ttl()
    if budget is None or lease is None:
        return  # not known
    (where_budget, length), (where_lease, ttl) = budget, lease
    if length is None or ttl is None:
        return  # no deadline
    if where_lease == configured.name("deadlines_lease_ttl") and not configured.lease_ttl_set:
        return  # the package's default lease: a short budget caps it, as it should
    if ttl > length and not _said_elsewhere(where_lease, where_budget, configured):
        yield _lease_problem(
            f"task {shown(task)}: its lease ({_s(ttl)}, {where_lease}) is longer than its "
            f"budget ({_s(length)}, {where_budget})",
            "Give the task a lease_ttl shorter than its budget (a third of it leaves "
            "a dead worker's run time to run again elsewhere),",
            configured,
        )


def _lease_problem(what: str, fix: str, configured: Configured) -> Problem:
    setting = configured.name("deadlines_lease_ttl")
    return Problem(
        "warning",
        "celery_deadlines.W009",
        f"{what}: the lease ends at the deadline, so a run whose worker dies is never taken "
        "over by another (it expires), and a claim that meets an unreachable database "
        "waits up to a whole lease for a run already past its deadline.",
        f"{fix} or lower {setting}.",
        (SETTINGS_REFERENCE, setting),
    )


# -- 4. deadlines_budgets entries that do nothing (W007, W008) ---------------------------------


def _budgets_entries(tasks: Mapping[str, Any], configured: Configured) -> Iterator[Problem]:
    budgets = configured.budgets
    if budgets is UNKNOWN:
        return
    setting = configured.name("deadlines_budgets")
    contracts = configured.contracts
    for name in budgets:
        where = f"{setting}[{shown(name)}]"
        task = tasks.get(name)
        if task is None:
            # a module not imported here (autodiscovery differs between a worker and
            # manage.py) may define it: a warning, as for a contract (W002)
            yield Problem(
                "warning",
                "celery_deadlines.W007",
                f"{where} names no registered task.",
                "Check the task's name (module path and function) for a typo, or that the "
                "module defining it is imported (autodiscovered) where this runs.",
                (SETTINGS_REFERENCE, setting),
            )
            continue
        if not is_deadline_task(task):
            why, fix = "is not a DeadlineTask", "Give the task base=DeadlineTask"
        elif getattr(task, "budget", UNSET) is not UNSET:
            own = shown(task.budget, 60)
            why, fix = f"sets its own budget ({own})", "Remove the task's budget= option"
        elif contracts is not UNKNOWN and _contract_budget(contracts.get(name)):
            why = f"has a budget in {configured.name('deadlines_contracts')}"
            fix = "Set the budget in the contract alone"
        else:
            continue
        yield Problem(
            "warning",
            "celery_deadlines.W008",
            f"{where} has no effect: task {shown(name)} {why}, which wins.",
            f"{fix}, or remove the entry.",
            (SETTINGS_REFERENCE, setting),
        )


def _contract_budget(contract: TimeContract | None) -> bool:
    return contract is not None and contract.budget is not UNSET


# -- 5. defaults that cannot work together (E008, W009) ----------------------------------------


def _defaults_that_do_not_fit(configured: Configured) -> Iterator[Problem]:
    budget = configured.default_budget
    if budget is UNKNOWN or budget is None:
        return
    name = configured.name
    default_budget = name("deadlines_default_budget")
    reserve = configured.default_reserve
    if reserve is not UNKNOWN and reserve >= budget:
        yield Problem(
            "error",
            "celery_deadlines.E008",
            f"{name('deadlines_default_reserve')} ({_s(reserve)}) leaves nothing of "
            f"{default_budget} ({_s(budget)}): every run of a task that names neither "
            "would be refused before it starts.",
            f"Make {name('deadlines_default_reserve')} shorter than {default_budget}.",
            (SETTINGS_REFERENCE, name("deadlines_default_reserve")),
        )
    attempt = configured.default_attempt_timeout
    if attempt is not UNKNOWN and attempt is not None and attempt > budget:
        yield Problem(
            "error",
            "celery_deadlines.E008",
            f"{name('deadlines_default_attempt_timeout')} ({_s(attempt)}) is longer than "
            f"{default_budget} ({_s(budget)}): a task that names neither could never retry.",
            f"Make {name('deadlines_default_attempt_timeout')} at most {default_budget}.",
            (SETTINGS_REFERENCE, name("deadlines_default_attempt_timeout")),
        )
    lease = configured.lease_ttl
    if (
        configured.ledger is True
        and configured.lease_ttl_set
        and lease is not UNKNOWN
        and lease > budget
    ):
        yield _lease_problem(
            f"{name('deadlines_lease_ttl')} ({_s(lease)}) is longer than {default_budget} "
            f"({_s(budget)}), the budget of every task that names neither",
            f"Make {name('deadlines_lease_ttl')} shorter than {default_budget} (a third of "
            "it leaves a dead worker's run time to run again elsewhere),",
            configured,
        )


# -- 8. a proxy list that trusts everyone (W010) -----------------------------------------------


def _too_wide_proxies(configured: Configured) -> Iterator[Problem]:
    networks = configured.trusted_proxies
    if networks is UNKNOWN:
        return
    setting = configured.name("deadlines_trusted_proxies")
    for network in networks:
        widest = WIDEST_TRUSTED_PREFIX[network.version]
        if network.prefixlen >= widest:
            continue
        how_many = (
            "every address of its family"
            if network.prefixlen == 0
            else f"2**{network.max_prefixlen - network.prefixlen} addresses, more than the "
            "largest private network (10.0.0.0/8, fc00::/7)"
        )
        yield Problem(
            "warning",
            "celery_deadlines.W010",
            f"{setting} trusts {network} ({how_many}): almost any client could set its own "
            "deadline headers.",
            f"List only the addresses or networks of the proxies that send the headers "
            f"(a network no wider than /{widest}).",
            (SETTINGS_REFERENCE, setting),
        )


# -- wording -----------------------------------------------------------------------------------


def _s(duration: timedelta) -> str:
    return f"{duration.total_seconds():g} s"
