"""Time contracts: every clock of one workflow, declared in one reviewable block.

A contract names a task and says how long its outcome is worth pursuing (``budget``),
how long its notices stay useful (``delivery_budget``), how long one worker may own it
(``lease_ttl``), what one attempt may take (``attempt_timeout``), the least time it
needs to start (``reserve``), how long each observation it relies on can be trusted
(``observation_ttl``), which of them must be fresh at the final side-effect boundary
(``revalidate_before``) and what the run does when time runs out (``on_expiry``)::

    CELERY_DEADLINES_CONTRACTS = {
        "shop.tasks.change_address": {
            "budget": 120, "delivery_budget": 3600, "lease_ttl": 90,
            "observation_ttl": {"order_state": 30, "customer_confirmation": 300},
            "revalidate_before": ["order_state", "customer_confirmation"],
            "on_expiry": "refuse",
        },
    }

This module is pure: it parses a contract and says what is wrong with it, alone
(:func:`parse_contracts`, raising :class:`InvalidDeadline`) and against the task it
names (:func:`review`, for the Django system checks). A contract's durations take the
place of the per-task setting in the precedence of :mod:`celery_deadlines.rules.budgets`:
call > task attribute > contract > ``deadlines_budgets`` > default; giving a value both
as a task attribute and in the contract is reported by :func:`review`, so the contract
stays the one place to read.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

from ..errors import InvalidDeadline
from .budgets import UNSET, Unset, capped_seconds, parse_budget, parse_duration
from .quoting import shown


class OnExpiry(enum.StrEnum):
    """What a run does when its time contract says it may no longer go on."""

    REVALIDATE = "revalidate"  # re-read the evidence, then go on if it still holds
    PAUSE = "pause"  # wait for a person (or a new decision) without acting
    REFUSE = "refuse"  # stop and say why; acting late is worse than not acting
    ESCALATE = "escalate"  # stop and hand the run to an operator


#: The durations a contract may set, as DeadlineTask spells its task options.
DURATION_KEYS: Final = ("budget", "delivery_budget", "reserve", "attempt_timeout", "lease_ttl")
KEYS: Final = (*DURATION_KEYS, "observation_ttl", "revalidate_before", "on_expiry")


@dataclass(frozen=True, slots=True)
class TimeContract:
    """One task's contract; a duration left :data:`UNSET` falls through to the settings."""

    task: str
    budget: timedelta | Unset | None = UNSET
    delivery_budget: timedelta | Unset | None = UNSET
    reserve: timedelta | Unset = UNSET
    attempt_timeout: timedelta | Unset = UNSET
    lease_ttl: timedelta | Unset = UNSET
    observation_ttl: Mapping[str, timedelta] = field(default_factory=dict)
    revalidate_before: tuple[str, ...] = ()
    on_expiry: OnExpiry = OnExpiry.REFUSE

    def given(self) -> tuple[str, ...]:
        """The duration keys this contract sets."""
        return tuple(key for key in DURATION_KEYS if getattr(self, key) is not UNSET)


def parse_contracts(value: object, *, name: str, maximum: timedelta) -> dict[str, TimeContract]:
    """``{task name: contract}`` from the setting's raw value, or :class:`InvalidDeadline`
    naming the task and the key to fix."""
    if not isinstance(value, Mapping):
        raise InvalidDeadline(
            f"{name} must map task names to contracts, got {type(value).__name__}"
        )
    contracts: dict[str, TimeContract] = {}
    for task, raw in value.items():
        if not isinstance(task, str) or not task:
            raise InvalidDeadline(f"{name} keys must be task names, got {shown(task)}")
        contracts[task] = parse_contract(task, raw, name=f"{name}[{shown(task)}]", maximum=maximum)
    return contracts


def parse_contract(task: str, raw: object, *, name: str, maximum: timedelta) -> TimeContract:
    """One contract, checked alone: its keys, its values, and that they fit together."""
    if not isinstance(raw, Mapping):
        raise InvalidDeadline(f"{name} must be a mapping of {', '.join(KEYS)}")
    unknown = sorted(str(key) for key in raw if key not in KEYS)
    if unknown:
        raise InvalidDeadline(
            f"{name} has unknown key(s) {', '.join(unknown)}; a contract may set {', '.join(KEYS)}"
        )
    values: dict[str, Any] = {}
    for key in ("budget", "delivery_budget"):
        if key in raw:
            values[key] = parse_budget(raw[key], name=f"{name}.{key}", maximum=maximum)
    if "reserve" in raw:
        values["reserve"] = parse_duration(raw["reserve"], name=f"{name}.reserve", allow_zero=True)
    for key in ("attempt_timeout", "lease_ttl"):
        if key in raw:
            values[key] = parse_duration(raw[key], name=f"{name}.{key}")
    ttls = _observation_ttls(raw.get("observation_ttl", {}), f"{name}.observation_ttl")
    revalidate = _sources(raw.get("revalidate_before", ()), f"{name}.revalidate_before")
    missing = [source for source in revalidate if source not in ttls]
    if missing:
        raise InvalidDeadline(
            f"{name}.revalidate_before names {', '.join(missing)}, which "
            f"{name}.observation_ttl does not give a TTL"
        )
    on_expiry = raw.get("on_expiry", OnExpiry.REFUSE.value)
    if not isinstance(on_expiry, str) or on_expiry not in {choice.value for choice in OnExpiry}:
        raise InvalidDeadline(
            f"{name}.on_expiry must be one of {', '.join(c.value for c in OnExpiry)}, "
            f"got {shown(on_expiry)}"
        )
    contract = TimeContract(
        task,
        **values,
        observation_ttl=ttls,
        revalidate_before=revalidate,
        on_expiry=OnExpiry(on_expiry),
    )
    _check_fit(contract, name)
    return contract


def _observation_ttls(raw: object, name: str) -> dict[str, timedelta]:
    if not isinstance(raw, Mapping):
        raise InvalidDeadline(f"{name} must map observation sources to TTLs")
    ttls: dict[str, timedelta] = {}
    for source, ttl in raw.items():
        if not isinstance(source, str) or not source:
            raise InvalidDeadline(f"{name} keys must be source names, got {shown(source)}")
        ttls[source] = parse_duration(ttl, name=f"{name}[{shown(source)}]")
    return ttls


def _sources(raw: object, name: str) -> tuple[str, ...]:
    if isinstance(raw, str) or not isinstance(raw, (list, tuple)):
        raise InvalidDeadline(f"{name} must be a list of observation sources, got {shown(raw)}")
    if not all(isinstance(source, str) and source for source in raw):
        raise InvalidDeadline(f"{name} must list source names, got {shown(raw)}")
    return tuple(raw)


def _check_fit(contract: TimeContract, name: str) -> None:
    """Durations that cannot work together (each names what to change)."""
    budget = contract.budget
    if not isinstance(budget, timedelta):
        return
    if isinstance(contract.lease_ttl, timedelta) and contract.lease_ttl > budget:
        raise InvalidDeadline(
            f"{name}.lease_ttl ({_s(contract.lease_ttl)}) is longer than its budget "
            f"({_s(budget)}): a lease never outlives the deadline; shorten lease_ttl"
        )
    if isinstance(contract.attempt_timeout, timedelta) and contract.attempt_timeout > budget:
        raise InvalidDeadline(
            f"{name}.attempt_timeout ({_s(contract.attempt_timeout)}) is longer than its "
            f"budget ({_s(budget)}): no attempt could finish in time"
        )
    if isinstance(contract.reserve, timedelta) and contract.reserve >= budget:
        raise InvalidDeadline(
            f"{name}.reserve ({_s(contract.reserve)}) leaves nothing of its budget "
            f"({_s(budget)}): every run would be refused"
        )


@dataclass(frozen=True, slots=True)
class Problem:
    """What :func:`review` found: a message naming the setting, and how to fix it."""

    message: str
    hint: str
    #: ``"warning"`` when the problem may be the checking process's view, not the
    #: contract (a task not registered *there*); otherwise ``"error"``
    severity: str = "error"


#: Brokers that redeliver a message held unacknowledged longer than a visibility
#: timeout, which a retry's countdown (an ETA message) is.
_DEFAULT_VISIBILITY_TIMEOUTS: Final = {
    "redis": timedelta(hours=1),
    "rediss": timedelta(hours=1),
    "sentinel": timedelta(hours=1),
    "sqs": timedelta(minutes=30),
}


def is_deadline_task(task: object) -> bool:
    """Whether ``task`` is a DeadlineTask (or a subclass): only one has a lease, whatever
    options it declares. Read without importing :mod:`celery_deadlines.task`, which
    sits above every module that asks (a pure rule, the checks, the workflow gate, beat)."""
    return hasattr(task, "lease_duration")


def review(
    contracts: Mapping[str, TimeContract],
    tasks: Mapping[str, Any],
    broker_url: str,
    transport_options: Mapping[str, Any],
    *,
    setting: str,
) -> list[Problem]:
    """Check each contract against the task it names: its time limits and retry backoff
    against the budget and the broker, and values given twice. ``tasks`` is the Celery
    app's registry; ``setting`` is how messages name the setting."""
    problems: list[Problem] = []
    for name, contract in contracts.items():
        where = f"{setting}[{shown(name)}]"
        task = tasks.get(name)
        if task is None:
            problems.append(
                Problem(
                    f"{where} names no registered task.",
                    "Check the task's name (module path and function) for a typo, or that "
                    "the module defining it is imported (autodiscovered) where this runs.",
                    severity="warning",
                )
            )
            continue
        if not is_deadline_task(task):  # nothing applies a contract to a plain task
            problems.append(
                Problem(
                    f"{where} names {name}, which is not a DeadlineTask.",
                    "Give the task base=DeadlineTask, or remove its contract.",
                )
            )
            continue
        problems.extend(_twice(contract, task, where))
        problems.extend(_limits(contract, task, where))
        problems.extend(_backoff(task, broker_url, transport_options, where))
    return problems


def _twice(contract: TimeContract, task: Any, where: str) -> list[Problem]:
    return [
        Problem(
            f"{where}.{key} is also set on the task itself ({shown(getattr(task, key))}).",
            f"Set {key} in one place: remove the task option, so the contract is what "
            "reviewers read.",
        )
        for key in contract.given()
        if getattr(task, key, UNSET) is not UNSET
    ]


def _limits(contract: TimeContract, task: Any, where: str) -> list[Problem]:
    budget = contract.budget
    if not isinstance(budget, timedelta):
        return []
    problems = []
    for limit in ("time_limit", "soft_time_limit"):
        value = getattr(task, limit, None)
        limit_ = capped_seconds(value) if isinstance(value, (int, float)) else None
        if limit_ is not None and limit_ > budget:
            problems.append(
                Problem(
                    f"{where}: the task's {limit} ({value} s) is longer than the contract's "
                    f"budget ({_s(budget)}).",
                    f"Lower {limit} or raise the budget: the deadline caps the limit anyway, "
                    "so the configured limit is misleading.",
                )
            )
    return problems


def _backoff(
    task: Any, broker_url: str, transport_options: Mapping[str, Any], where: str
) -> list[Problem]:
    scheme = broker_url.split("://", 1)[0].split("+")[0]
    if scheme not in _DEFAULT_VISIBILITY_TIMEOUTS or not getattr(task, "autoretry_for", ()):
        return []
    if getattr(task, "retry_backoff", False):
        longest = _seconds_or(getattr(task, "retry_backoff_max", 600) or 600)
        source = "retry_backoff_max"
    else:
        longest = _seconds_or(getattr(task, "default_retry_delay", 180) or 0)
        source = "default_retry_delay"
    raw = transport_options.get("visibility_timeout")
    timeout = _seconds_or(raw) if raw is not None else _DEFAULT_VISIBILITY_TIMEOUTS[scheme]
    if longest <= timeout:
        return []
    return [
        Problem(
            f"{where}: a retry may wait up to {_s(longest)} ({source}), longer than the "
            f"broker's visibility_timeout ({_s(timeout)}): the broker would deliver the "
            "retry again while it waits.",
            f"Lower the task's {source} or raise broker_transport_options['visibility_timeout'].",
        )
    ]


def _seconds_or(value: object) -> timedelta:
    """A task's or transport's number of seconds, read as Celery would use it (a value
    that is not a number is none: zero)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return timedelta(0)
    return capped_seconds(value) or timedelta(0)


def _s(duration: timedelta) -> str:
    return f"{duration.total_seconds():g} s"
