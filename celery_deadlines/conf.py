"""Settings, read lazily through the Celery app's configuration.

Plain Celery users write ``app.conf.deadlines_default_budget = 30``; Django users who
load settings with ``namespace="CELERY"`` write ``CELERY_DEADLINES_DEFAULT_BUDGET = 30``.
Nothing is read at import: each value is read when a task is published or claimed, so
changing the configuration (``override_settings`` included) takes effect at once.
A bad value raises :class:`ConfigurationError` naming the setting in both spellings
and repeating at most :data:`~celery_deadlines.rules.quoting.LIMIT` characters of it,
whatever it is (a value whose own methods fail too).
"""

from __future__ import annotations

import ipaddress
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Generic, TypeVar

from .errors import ConfigurationError, InvalidDeadline
from .rules.budgets import parse_budget, parse_duration
from .rules.contracts import TimeContract, parse_contracts
from .rules.database import parse_cap
from .rules.incoming import (
    Network,
    RequestBudgets,
    Syntax,
    parse_header_name,
    parse_honoured,
    parse_networks,
    parse_request_budgets,
)
from .rules.outgoing import DEFAULT_HEADERS as DEFAULT_OUTBOUND_HEADERS
from .rules.quoting import shown
from .rules.retention import DEFAULT_RETENTION, parse_retention

T = TypeVar("T")

#: Budgets longer than this are refused as a unit or clock error (override per project).
DEFAULT_MAX_BUDGET: Final = timedelta(days=7)


__all__ = ["Settings", "settings_for"]


@dataclass(frozen=True, slots=True)
class Setting(Generic[T]):
    """One setting: its Celery name, its default and how a raw value is checked."""

    name: str
    default: object
    parse: Callable[[object, str, Settings], T]
    doc: str

    @property
    def django_name(self) -> str:
        return f"CELERY_{self.name.upper()}"

    def describe(self) -> str:
        return f"setting {self.name} (Django: {self.django_name})"


def _optional_budget(value: object, name: str, settings: Settings) -> timedelta | None:
    return parse_budget(value, name=name, maximum=settings.budget_bound())


def _budgets(value: object, name: str, settings: Settings) -> dict[str, timedelta | None]:
    if not isinstance(value, Mapping):
        raise InvalidDeadline(f"{name} must map task names to budgets, got {type(value).__name__}")
    parsed: dict[str, timedelta | None] = {}
    for task_name, budget in value.items():
        if not isinstance(task_name, str):
            raise InvalidDeadline(f"{name} keys must be task names, got {shown(task_name)}")
        parsed[task_name] = _optional_budget(budget, f"{name}[{shown(task_name)}]", settings)
    return parsed


def _contracts(value: object, name: str, settings: Settings) -> dict[str, TimeContract]:
    return parse_contracts(value, name=name, maximum=settings.budget_bound())


def _reserve(value: object, name: str, settings: Settings) -> timedelta:
    return parse_duration(value, name=name, allow_zero=True)


def _optional_duration(value: object, name: str, settings: Settings) -> timedelta | None:
    return None if value is None else parse_duration(value, name=name)


def _max_budget(value: object, name: str, settings: Settings) -> timedelta:
    return parse_duration(value, name=name)


def _positive_duration(value: object, name: str, settings: Settings) -> timedelta:
    return parse_duration(value, name=name)


#: The most leases a run can have lost: the ledger counts them in a 32-bit column, so a
#: larger maximum is never reached (and is no number SQLite or PostgreSQL compares it with).
MOST_LOST_LEASES: Final = 2**31 - 1


def _lost_leases(value: object, name: str, settings: Settings) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MOST_LOST_LEASES:
        raise InvalidDeadline(
            f"{name} must be a whole number from 0 to {MOST_LOST_LEASES}, got {shown(value)}"
        )
    return value


def _port(value: object, name: str, settings: Settings) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise InvalidDeadline(
            f"{name} must be a TCP port from 1 to 65535, or None; got {shown(value)}"
        )
    return value


def _database_alias(value: object, name: str, settings: Settings) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidDeadline(f"{name} must name a database alias, got {shown(value)}")
    return value


DEFAULT_BUDGET: Final = Setting(
    "deadlines_default_budget",
    None,
    _optional_budget,
    "Budget of a DeadlineTask that names none; None: no deadline.",
)
BUDGETS: Final = Setting(
    "deadlines_budgets",
    {},
    _budgets,
    "Per-task budgets, {task name: seconds | timedelta | None}.",
)
CONTRACTS: Final = Setting(
    "deadlines_contracts",
    {},
    _contracts,
    "Time contracts, {task name: {budget, delivery_budget, reserve, attempt_timeout, "
    "lease_ttl, observation_ttl, revalidate_before, on_expiry}}; see the how-to "
    "'Declare a time contract'.",
)
DEFAULT_DELIVERY_BUDGET: Final = Setting(
    "deadlines_default_delivery_budget",
    None,
    _optional_budget,
    "Delivery budget of a DeadlineTask that names none; None: no delivery deadline.",
)
DEFAULT_RESERVE: Final = Setting(
    "deadlines_default_reserve",
    0,
    _reserve,
    "Least time that must be left for a task to start, when it names no reserve.",
)
DEFAULT_ATTEMPT_TIMEOUT: Final = Setting(
    "deadlines_default_attempt_timeout",
    None,
    _optional_duration,
    "What one attempt may take, for the retry gate, when a task names neither "
    "attempt_timeout nor time_limit; None: count the countdown only.",
)
CLOCK_SKEW_ALLOWANCE: Final = Setting(
    "deadlines_clock_skew_allowance",
    0.5,
    _reserve,
    "Added to every retry reservation for the difference between worker clocks.",
)
CLOCK_SKEW_BUDGET: Final = Setting(
    "deadlines_clock_skew_budget",
    None,
    _optional_duration,
    "Largest error a worker's wall clock may have against the ledger's clock; beyond it "
    "the worker takes no new work. None: not measured (ledger tier only).",
)
MAX_BUDGET: Final = Setting(
    "deadlines_max_budget",
    DEFAULT_MAX_BUDGET,
    _max_budget,
    "Longest budget accepted, and how far ahead a deadline header may lie.",
)


#: What the workflow gate does with a chain, group or chord that cannot fit its deadline.
WORKFLOW_CHECK_MODES: Final = ("refuse", "warn", "off")


def _workflow_check(value: object, name: str, settings: Settings) -> str:
    if not isinstance(value, str) or value not in WORKFLOW_CHECK_MODES:
        choices = ", ".join(repr(mode) for mode in WORKFLOW_CHECK_MODES)
        raise InvalidDeadline(f"{name} must be one of {choices}, got {shown(value)}")
    return value


WORKFLOW_CHECK: Final = Setting(
    "deadlines_workflow_check",
    "refuse",
    _workflow_check,
    "A chain, group or chord whose critical path cannot fit its deadline: 'refuse' "
    "raises WorkflowRefused and publishes nothing, 'warn' logs the arithmetic and "
    "publishes, 'off' does not compute it.",
)

METRICS_PORT: Final = Setting(
    "deadlines_metrics_port",
    None,
    _port,
    "The port a worker serves its Prometheus metrics on, from its main process once it "
    "is ready (needs the prometheus extra); None: not served.",
)


def _address(value: object, name: str, settings: Settings) -> str:
    if not isinstance(value, str):
        raise InvalidDeadline(f"{name} must be an IP address, got {shown(value)}")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise InvalidDeadline(
            f"{name} must be an IP address ('127.0.0.1', '0.0.0.0', '::'), got {shown(value)}"
        ) from None


METRICS_ADDRESS: Final = Setting(
    "deadlines_metrics_address",
    "127.0.0.1",
    _address,
    "The address the metrics port is bound to: '127.0.0.1' (this machine only), "
    "'0.0.0.0' (every IPv4 interface), '::' (every interface) or one interface's.",
)


# -- the incoming request (ingress_scope, the Django middleware) -----------------------------
def _request_budgets(value: object, name: str, settings: Settings) -> RequestBudgets:
    return parse_request_budgets(value, name=name, maximum=settings.budget_bound())


def _honoured(value: object, name: str, settings: Settings) -> dict[str, Syntax]:
    return parse_honoured(value, name=name)


def _networks(value: object, name: str, settings: Settings) -> tuple[Network, ...]:
    return parse_networks(value, name=name)


def _optional_header(value: object, name: str, settings: Settings) -> str | None:
    return None if value is None else parse_header_name(value, name=name)


REQUEST_BUDGET: Final = Setting(
    "deadlines_request_budget",
    None,
    _optional_budget,
    "Budget of a request whose view names none (middleware); None: such a request "
    "opens no deadline scope.",
)
REQUEST_BUDGETS: Final = Setting(
    "deadlines_request_budgets",
    {},
    _request_budgets,
    "Request budgets, {URL name or '/path/pattern*': seconds | timedelta | None}.",
)
REQUEST_HEADERS: Final = Setting(
    "deadlines_request_headers",
    {},
    _honoured,
    "Incoming headers that may shorten a request's budget, {header name: 'grpc-timeout' "
    "| 'milliseconds' | 'rfc3339'}; read only from deadlines_trusted_proxies.",
)
TRUSTED_PROXIES: Final = Setting(
    "deadlines_trusted_proxies",
    (),
    _networks,
    "Addresses and networks (CIDR) whose deadline headers are honoured (the peer's "
    "address, REMOTE_ADDR); empty: none.",
)
REMAINING_HEADER: Final = Setting(
    "deadlines_remaining_header",
    None,
    _optional_header,
    "Response header that says how many milliseconds the request had left; None: not sent.",
)


# -- a call to another service (outbound.py and its client adapters) -------------------------
OUTBOUND_HEADERS: Final = Setting(
    "deadlines_outbound_headers",
    DEFAULT_OUTBOUND_HEADERS,
    _honoured,
    "Headers that carry the deadline to the services a body calls, {header name: "
    "'grpc-timeout' | 'milliseconds' | 'rfc3339'} (the receiving side's "
    "deadlines_request_headers); {}: none, the calls' timeouts are still capped.",
)
OUTBOUND_RESERVE: Final = Setting(
    "deadlines_outbound_reserve",
    0.1,
    _reserve,
    "Time an outbound call leaves its caller: its timeout is at most the time left minus "
    "this, and a call with no more than this left is refused before it is sent.",
)


# -- the body's database queries (core/database.py) -------------------------------------------
def _database_cap(value: object, name: str, settings: Settings) -> bool | frozenset[str]:
    return parse_cap(value, name=name)


DATABASE_CAP: Final = Setting(
    "deadlines_database_cap",
    True,
    _database_cap,
    "A DeadlineTask body's queries end by the run's deadline (PostgreSQL: "
    "statement_timeout and lock_timeout from the time left; SQLite: the query is "
    "interrupted); False: not capped; a list of database aliases: those only.",
)


# -- the run ledger (Django tier) ------------------------------------------------------------
def _flag(value: object, name: str, settings: Settings) -> bool:
    if not isinstance(value, bool):
        raise InvalidDeadline(f"{name} must be True or False, got {shown(value)}")
    return value


#: On by default: refusing at the door only what the claim gate would refuse after a
#: worker fetched it (or, under overload, the excess that cannot start in time) spends
#: no worker on it and tells its caller at once.
BACKLOG_REFUSAL: Final = Setting(
    "deadlines_backlog_refusal",
    True,
    _flag,
    "True: refuse at enqueue (reason 'queue_backlog') a publish that the queue ahead of "
    "it, taken off at the rate it was seen served, cannot reach before its last start, "
    "and under overload one that would wait more than a tenth of its budget (a Redis "
    "broker's queue, read by the publisher; the default). False: the claim gate alone "
    "judges it.",
)

LEDGER: Final = Setting(
    "deadlines_ledger",
    True,
    _flag,
    "Record this Celery app's DeadlineTask runs in the ledger when the Django app is "
    "installed; False keeps the app on the header-only tier.",
)
LEASE_TTL: Final = Setting(
    "deadlines_lease_ttl",
    30,
    _positive_duration,
    "How long a claim lets one worker own a run; renewed while the body runs, "
    "never past the deadline.",
)
RECONCILE_INTERVAL: Final = Setting(
    "deadlines_reconcile_interval",
    10,
    _optional_duration,
    "How often each worker reconciles expired leases and sweeps the outbox; "
    "None: only when the worker starts.",
)
REPUBLISH_AFTER: Final = Setting(
    "deadlines_republish_after",
    60,
    _positive_duration,
    "A run still unclaimed this long after its last publish is published again "
    "(the broker may have lost the message; a duplicate is harmless).",
)
MAX_LOST_LEASES: Final = Setting(
    "deadlines_max_lost_leases",
    3,
    _lost_leases,
    "Leases a run may lose (its worker died or stalled) before it fails with "
    "reason worker_lost instead of running again.",
)
DATABASE: Final = Setting(
    "deadlines_database",
    "default",
    _database_alias,
    "The Django database alias of the run ledger (PostgreSQL or SQLite).",
)


def _retention(value: object, name: str, settings: Settings) -> timedelta | None:
    return parse_retention(value, name=name)


RETENTION: Final = Setting(
    "deadlines_retention",
    DEFAULT_RETENTION,
    _retention,
    "How long an ended run stays in the ledger before the workers' reconcilers purge it "
    "with its events, effects and plans (hourly, in bounded batches); None or 0: never "
    "purged automatically (manage.py deadlines purge still can).",
)

#: Every setting, in documentation order.
SETTINGS: Final[tuple[Setting[Any], ...]] = (
    DEFAULT_BUDGET,
    BUDGETS,
    CONTRACTS,
    DEFAULT_DELIVERY_BUDGET,
    DEFAULT_RESERVE,
    DEFAULT_ATTEMPT_TIMEOUT,
    CLOCK_SKEW_ALLOWANCE,
    CLOCK_SKEW_BUDGET,
    MAX_BUDGET,
    WORKFLOW_CHECK,
    BACKLOG_REFUSAL,
    METRICS_PORT,
    METRICS_ADDRESS,
    REQUEST_BUDGET,
    REQUEST_BUDGETS,
    REQUEST_HEADERS,
    TRUSTED_PROXIES,
    REMAINING_HEADER,
    OUTBOUND_HEADERS,
    OUTBOUND_RESERVE,
    DATABASE_CAP,
    LEDGER,
    LEASE_TTL,
    RECONCILE_INTERVAL,
    REPUBLISH_AFTER,
    MAX_LOST_LEASES,
    DATABASE,
    RETENTION,
)


#: "not looked up yet" (a setting's raw value may be ``None``)
_MISSING: Final = object()


class Settings:
    """Typed, lazy view of one Celery app's celery-deadlines settings.

    Nothing is read before the first use. Reading a missing key through Celery's
    configuration costs several microseconds (it probes every spelling in every
    source, Django's settings included), too much for every publish, so each raw value
    is looked up once and cached. Two things refresh it: a value set at run time
    (``app.conf.deadlines_x = ...`` lands in ``conf.changes``, which is checked on
    every read, cheaply) and Django's ``setting_changed`` signal (``override_settings``),
    which calls :meth:`reload`. Call :meth:`reload` yourself after any other change.
    :meth:`stamp` tells a reader that keeps what it worked out from the values (a task's
    durations, :func:`celery_deadlines.core.options.times`) whether they may have changed.
    """

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self._conf = conf
        #: how many times the cached values were forgotten (:meth:`reload`)
        self.generation = 0
        #: every spelling of every setting of this package, once looked up
        self._ours: frozenset[str] | None = None
        self._raw: dict[str, object] = {}
        # raw value -> parsed value, re-parsed only when the raw object changes
        self._parsed: dict[str, tuple[object, object]] = {}
        self._spellings: dict[str, tuple[str, ...]] = {}

    def rebind(self, conf: Mapping[str, Any]) -> None:
        """Read ``conf`` from now on (Celery replaces an app's ``conf`` when configured)."""
        self._conf = conf
        self._spellings.clear()
        self._ours = None
        self.reload()

    def get(self, setting: Setting[T]) -> T:
        """The parsed value of ``setting``, or :class:`ConfigurationError` naming it."""
        # one flat function: this runs several times at every publish
        name = setting.name
        raw: object = _MISSING
        changes = getattr(self._conf, "changes", None)
        if changes:
            spellings = self._spellings.get(name) or self._spellings_of(name)
            for spelling in spellings:
                if spelling in changes:
                    raw = changes[spelling]
                    break
        if raw is _MISSING:
            raw = self._raw.get(name, _MISSING)
            if raw is _MISSING:
                raw = self._raw[name] = self._conf.get(name, setting.default)
        cached = self._parsed.get(name)
        if cached is not None and cached[0] is raw:
            return cached[1]  # type: ignore[return-value]
        try:
            value = setting.parse(raw, name, self)
        except InvalidDeadline as exc:
            raise ConfigurationError(f"{setting.describe()}: {exc}") from exc
        except Exception as exc:  # a value whose own methods fail: a mapping's items()
            raise ConfigurationError(
                f"{setting.describe()}: {shown(raw)} cannot be read ({type(exc).__name__})"
            ) from exc
        self._parsed[name] = (raw, value)
        return value

    def reload(self) -> None:
        """Forget every cached value: the next read asks the configuration again."""
        self._raw.clear()
        self._parsed.clear()
        self.generation += 1

    def stamp(self) -> object:
        """A value equal to the last one for as long as no value of this package's
        settings can have changed: the reload count (:meth:`reload`), with the values of
        those set at run time (``app.conf.deadlines_x = ...``, or ``app.conf.update``),
        which every read looks up again."""
        changes = getattr(self._conf, "changes", None)
        if changes:
            ours = self._ours
            if ours is None:
                ours = self._ours = frozenset(
                    spelling
                    for setting in SETTINGS
                    for spelling in self._spellings_of(setting.name)
                )
            if not ours.isdisjoint(changes):
                present = sorted(ours.intersection(changes))
                return (self.generation, tuple((key, changes[key]) for key in present))
        return self.generation

    def _spellings_of(self, name: str) -> tuple[str, ...]:
        try:
            return self._spellings[name]
        except KeyError:
            to_keys = getattr(self._conf, "_to_keys", None)
            spellings = tuple(dict.fromkeys(to_keys(name))) if to_keys else (name,)
            self._spellings[name] = spellings
            return spellings

    def check(self) -> list[ConfigurationError]:
        """Every setting's error, for system checks (empty when all are fine)."""
        return [error for _, error in self.failing()]

    def failing(self) -> list[tuple[Setting[Any], ConfigurationError]]:
        """Every setting whose value is refused, with its error (the system checks'
        E001, and what stops a worker: :mod:`celery_deadlines.core.preflight`)."""
        failing = []
        for setting in SETTINGS:
            try:
                self.get(setting)
            except ConfigurationError as exc:
                failing.append((setting, exc))
        return failing

    def contract_of(self, task_name: str) -> TimeContract | None:
        """The time contract of ``task_name``, if ``deadlines_contracts`` has one."""
        return self.get(CONTRACTS).get(task_name)

    @property
    def max_budget(self) -> timedelta:
        return self.get(MAX_BUDGET)

    def budget_bound(self) -> timedelta:
        """The bound other budget settings are checked against.

        A bad ``deadlines_max_budget`` is reported once, as itself, not again as an
        error of every budget setting checked against it.
        """
        try:
            return self.max_budget
        except ConfigurationError:
            return DEFAULT_MAX_BUDGET


#: Every app's settings, for :func:`reload_all` (each is also kept on its app, where
#: :func:`settings_for` finds it without hashing the app).
_all: weakref.WeakSet[Settings] = weakref.WeakSet()
_ATTRIBUTE: Final = "_celery_deadlines_settings"


def reload_all() -> None:
    """Forget the cached settings of every app (Django's ``setting_changed`` calls this)."""
    for settings in list(_all):
        settings.reload()


def tracked(conf: Mapping[str, Any]) -> Settings:
    """A :class:`Settings` reading ``conf`` (any mapping), reloaded by :func:`reload_all`
    like every app's (the Django middleware reads Django's settings through one)."""
    settings = Settings(conf)
    _all.add(settings)
    return settings


def settings_for(app: Any) -> Settings:
    """The :class:`Settings` of a Celery app (one instance per app; proxies unwrapped).

    Reading a setting through it validates it: a bad value raises
    :class:`~celery_deadlines.ConfigurationError` naming the setting."""
    # an attribute of the app itself: this runs at every publish and claim
    settings: Settings | None = getattr(app, _ATTRIBUTE, None)
    if settings is not None and settings._conf is getattr(app, "_conf", None):
        # the configuration Celery loaded, read without its ``conf`` property (a call
        # more); one not loaded yet, or replaced, is not this one: asked for below
        return settings
    conf = app.conf
    if settings is None:
        unwrap = getattr(app, "_get_current_object", None)
        real = unwrap() if unwrap is not None else app
        settings = Settings(conf)
        setattr(real, _ATTRIBUTE, settings)
        _all.add(settings)
    elif settings._conf is not conf:
        settings.rebind(conf)
    return settings
