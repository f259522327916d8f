"""What tasks declare, reviewed as pure values: the rules behind ``manage.py check``'s
E006 to E009 and W006 to W010 (the Django glue is tests/django/test_declaration_checks.py)."""

from __future__ import annotations

import ipaddress
import itertools
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import pytest

from celery_deadlines import conf
from celery_deadlines.core import options
from celery_deadlines.rules.contracts import parse_contracts
from celery_deadlines.rules.declarations import (
    DURATIONS,
    UNKNOWN,
    Configured,
    Problem,
    Resolved,
    review,
    review_settings,
)

TASK = "shop.tasks.charge"
#: What a Celery Task and a DeadlineTask have (a subset: the fakes below have no more).
KNOWN = frozenset({*DURATIONS, "deadline_kind", "reconcilers", "name", "time_limit"})
#: Named as a Django project spells settings; without the ledger (leases: only their tests)
DJANGO = Configured(ledger=False, name=lambda setting: f"CELERY_{setting.upper()}")


class FakeTask:
    """A stand-in for a DeadlineTask: only a DeadlineTask has ``lease_duration``."""

    name = TASK
    time_limit: float | None = None
    soft_time_limit: float | None = None

    def lease_duration(self) -> timedelta:  # pragma: no cover (never called)
        raise AssertionError


class PlainTask:
    """A Celery task that is not a DeadlineTask."""

    name = "shop.tasks.plain"


def task(**declared: Any) -> Any:
    """A DeadlineTask declared with ``declared`` as task options, as Celery's
    ``@app.task(base=DeadlineTask, **options)`` makes one: a subclass holding them."""
    return type("charge", (FakeTask,), declared)()


def configured(**values: Any) -> Configured:
    return Configured(**{"name": DJANGO.name, "ledger": False, **values})


def found(
    declared: Mapping[str, Any] | None = None,
    settings: Configured = DJANGO,
    tasks: Mapping[str, Any] | None = None,
) -> list[Problem]:
    registry = dict(tasks) if tasks is not None else {TASK: task(**(declared or {}))}
    return review(registry, settings, known_attributes=KNOWN)


def ids(problems: list[Problem]) -> list[str]:
    return [problem.id.removeprefix("celery_deadlines.") for problem in problems]


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def test_a_task_with_fitting_options_and_the_defaults_has_no_problem() -> None:
    assert found({"budget": 30, "reserve": 1, "attempt_timeout": 5, "lease_ttl": 10}) == []
    assert found({}) == []
    assert review_settings(DJANGO) == []


# -- 1. a bad value (E006) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "complaint"),
    [
        ("budget", -3, "must be more than zero seconds, got -3"),
        ("budget", float("nan"), "must be finite"),
        ("budget", "10", "must be a number of seconds or a timedelta"),
        ("budget", True, "must be a number of seconds or a timedelta"),
        ("budget", 10**400, ""),  # too large even for a float
        ("budget", 1e300, ""),  # too large for a timedelta
        ("delivery_budget", 0, "must be more than zero seconds"),
        ("reserve", -1, "must be zero or more seconds"),
        ("attempt_timeout", timedelta(seconds=-5), "must be more than zero seconds"),
        ("lease_ttl", None, "must be a number of seconds or a timedelta"),
        ("lease_ttl", float("inf"), "finite"),
    ],
)
def test_a_task_option_with_a_bad_value_is_an_error_naming_the_task_and_the_option(
    option: str, value: object, complaint: str
) -> None:
    [problem] = found({option: value})
    assert (problem.severity, problem.id) == ("error", "celery_deadlines.E006")
    assert f"task {TASK!r} option {option}" in problem.message
    assert complaint in problem.message
    assert problem.hint.startswith(f"Give {option} as ")
    assert problem.read == ("Settings reference", "Task options")


@pytest.mark.parametrize("option", ["budget", "delivery_budget", "reserve", "attempt_timeout"])
def test_none_is_a_good_value_of_every_option_but_the_lease(option: str) -> None:
    assert found({option: None}) == []


def test_a_bad_option_is_left_out_of_the_checks_that_need_its_value() -> None:
    assert ids(found({"budget": -3, "reserve": 60})) == ["E006"]


# -- 2. an option that does not fit the budget (E007) ------------------------------------------


def test_a_reserve_as_long_as_the_budget_is_an_error_naming_both_and_where_they_come_from() -> None:
    [problem] = found({"budget": 10, "reserve": 10})
    assert problem.id == "celery_deadlines.E007"
    assert f"task {TASK!r}: its reserve (10 s, task option)" in problem.message
    assert "budget (10 s, task option)" in problem.message
    assert found({"budget": 10, "reserve": 9.5}) == []


def test_an_attempt_timeout_longer_than_the_budget_is_an_error() -> None:
    [problem] = found({"budget": 10, "attempt_timeout": 11})
    assert problem.id == "celery_deadlines.E007"
    assert "attempt_timeout (11 s, task option) is longer than its budget (10 s" in problem.message
    assert found({"budget": 10, "attempt_timeout": 10}) == []


def test_the_budget_a_reserve_is_checked_against_is_the_one_a_publish_would_use() -> None:
    from_setting = configured(budgets={TASK: s(2)}, default_budget=s(60))
    [problem] = found({"reserve": 3}, from_setting)
    assert "budget (2 s, CELERY_DEADLINES_BUDGETS)" in problem.message
    [problem] = found({"reserve": 90}, configured(default_budget=s(60)))
    assert "budget (60 s, CELERY_DEADLINES_DEFAULT_BUDGET)" in problem.message
    assert found({"reserve": 90}) == []  # no budget anywhere: no deadline to fit in
    assert found({"reserve": 90, "budget": None}, configured(default_budget=s(60))) == []


def test_a_time_limit_stands_for_the_attempt_timeout_the_task_does_not_name() -> None:
    [problem] = found({"budget": 10, "time_limit": 30})
    assert "attempt_timeout (30 s, time_limit)" in problem.message
    assert problem.hint.startswith("Make time_limit at most the budget")
    assert found({"budget": 10, "time_limit": 30, "attempt_timeout": 5}) == []


def test_a_pair_both_from_the_contract_or_both_from_the_defaults_is_left_to_their_checks() -> None:
    contracts = parse_contracts({TASK: {"budget": 10}}, name="c", maximum=timedelta(days=7))
    defaults = configured(default_budget=s(5), default_reserve=s(5))
    assert ids(found({}, defaults)) == []  # review_settings says it, once
    assert ids(review_settings(defaults)) == ["E008"]
    mixed = configured(contracts=contracts, default_reserve=s(10))
    assert ids(found({}, mixed)) == ["E007"]


# -- 3. a misspelled option (W006) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("budgte", "budget"),
        ("resrve", "reserve"),
        ("attempt_timout", "attempt_timeout"),
        ("lease", "lease_ttl"),
        ("delivery_budgte", "delivery_budget"),
        ("deadline", "deadline_kind"),
    ],
)
def test_a_misspelled_option_is_a_warning_naming_the_closest_option(typo: str, meant: str) -> None:
    [problem] = found({typo: 10})
    assert (problem.severity, problem.id) == ("warning", "celery_deadlines.W006")
    assert f"task {TASK!r} has the attribute {typo} = 10" in problem.message
    assert f"did you mean {meant}?" in problem.message
    assert problem.hint.startswith(f"Rename the option {typo} to {meant}")


def test_methods_private_names_known_attributes_and_unlike_names_are_not_typos() -> None:
    def budget_for(self: Any) -> int:  # pragma: no cover (never called)
        return 1

    declared = {"budget_for": budget_for, "_budget": 1, "time_limit": 5, "colour": "blue"}
    assert found(declared) == []


def test_only_deadline_tasks_are_reviewed() -> None:
    plain = type("plain", (PlainTask,), {"budget": -3, "budgte": 1})()
    assert found(tasks={plain.name: plain}) == []


# -- 4. deadlines_budgets entries that do nothing (W007, W008) ---------------------------------


def test_a_budgets_entry_naming_no_registered_task_is_a_warning() -> None:
    [problem] = found({}, configured(budgets={"shop.tasks.chrage": s(5)}))
    assert (problem.severity, problem.id) == ("warning", "celery_deadlines.W007")
    assert "CELERY_DEADLINES_BUDGETS['shop.tasks.chrage'] names no registered task" in (
        problem.message
    )
    assert problem.read == ("Settings reference", "CELERY_DEADLINES_BUDGETS")


def test_a_budgets_entry_the_tasks_own_budget_overrides_is_a_warning_that_it_does_nothing() -> None:
    [problem] = found({"budget": 10}, configured(budgets={TASK: s(5)}))
    assert (problem.severity, problem.id) == ("warning", "celery_deadlines.W008")
    assert f"CELERY_DEADLINES_BUDGETS[{TASK!r}] has no effect" in problem.message
    assert "sets its own budget (10)" in problem.message


def test_a_budgets_entry_a_contract_or_a_plain_task_makes_useless_is_a_warning_too() -> None:
    contracts = parse_contracts({TASK: {"budget": 10}}, name="c", maximum=timedelta(days=7))
    [problem] = found({}, configured(budgets={TASK: s(5)}, contracts=contracts))
    assert "has a budget in CELERY_DEADLINES_CONTRACTS" in problem.message
    plain = PlainTask()
    [problem] = found(tasks={plain.name: plain}, settings=configured(budgets={plain.name: s(5)}))
    assert (problem.id, "is not a DeadlineTask" in problem.message) == (
        "celery_deadlines.W008",
        True,
    )


# -- 5. defaults that cannot work together (E008) ----------------------------------------------


def test_a_default_reserve_as_long_as_the_default_budget_is_an_error() -> None:
    [problem] = review_settings(configured(default_budget=s(5), default_reserve=s(5)))
    assert (problem.severity, problem.id) == ("error", "celery_deadlines.E008")
    assert "CELERY_DEADLINES_DEFAULT_RESERVE (5 s) leaves nothing of " in problem.message
    assert "CELERY_DEADLINES_DEFAULT_BUDGET (5 s)" in problem.message
    assert review_settings(configured(default_budget=s(5), default_reserve=s(4))) == []
    assert review_settings(configured(default_budget=None, default_reserve=s(4))) == []


def test_a_default_attempt_timeout_longer_than_the_default_budget_is_an_error() -> None:
    [problem] = review_settings(configured(default_budget=s(5), default_attempt_timeout=s(6)))
    assert problem.id == "celery_deadlines.E008"
    assert "CELERY_DEADLINES_DEFAULT_ATTEMPT_TIMEOUT (6 s) is longer than" in problem.message


# -- 6. a declared budget the maximum refuses (E009) -------------------------------------------


@pytest.mark.parametrize("option", ["budget", "delivery_budget"])
def test_a_task_budget_longer_than_the_maximum_budget_is_an_error(option: str) -> None:
    [problem] = found({option: timedelta(days=8)})
    assert problem.id == "celery_deadlines.E009"
    assert f"task {TASK!r} option {option} (691200 s) is longer than " in problem.message
    assert "CELERY_DEADLINES_MAX_BUDGET (604800 s)" in problem.message
    assert problem.read == ("Settings reference", "CELERY_DEADLINES_MAX_BUDGET")
    assert found({option: timedelta(days=8)}, configured(max_budget=timedelta(days=9))) == []


# -- 7. a lease longer than the budget (W009) --------------------------------------------------


def test_a_lease_longer_than_the_budget_is_a_warning_naming_where_each_comes_from() -> None:
    [problem] = found({"budget": 10}, configured(ledger=True, lease_ttl=s(30)))
    assert (problem.severity, problem.id) == ("warning", "celery_deadlines.W009")
    assert "its lease (30 s, CELERY_DEADLINES_LEASE_TTL) is longer than its budget (10 s, " in (
        problem.message
    )
    assert "never taken over" in problem.message
    assert problem.read == ("Settings reference", "CELERY_DEADLINES_LEASE_TTL")
    assert found({"budget": 10, "lease_ttl": 3}, configured(ledger=True, lease_ttl=s(30))) == []
    [own] = found({"budget": 10, "lease_ttl": 12}, configured(ledger=True))
    assert "its lease (12 s, task option)" in own.message


def test_without_the_ledger_there_is_no_lease_to_warn_about() -> None:
    assert found({"budget": 10}, configured(ledger=False)) == []


def test_a_lease_setting_longer_than_the_default_budget_is_said_once_not_for_every_task() -> None:
    settings = configured(ledger=True, default_budget=s(10), lease_ttl=s(30))
    assert found({}, settings) == []
    [problem] = review_settings(settings)
    assert problem.id == "celery_deadlines.W009"
    assert "CELERY_DEADLINES_LEASE_TTL (30 s) is longer than CELERY_DEADLINES_DEFAULT_BUDGET" in (
        problem.message
    )


# -- 8. a proxy list that trusts everyone (W010) -----------------------------------------------


@pytest.mark.parametrize(
    ("network", "complaint"),
    [
        ("0.0.0.0/0", "every address of its family"),
        ("::/0", "every address of its family"),
        ("0.0.0.0/1", "2**31 addresses"),
        ("2000::/3", "2**125 addresses"),
    ],
)
def test_a_trusted_network_wider_than_any_private_one_is_a_warning(
    network: str, complaint: str
) -> None:
    proxies = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network(network))
    [problem] = review_settings(configured(trusted_proxies=proxies))
    assert (problem.severity, problem.id) == ("warning", "celery_deadlines.W010")
    assert f"CELERY_DEADLINES_TRUSTED_PROXIES trusts {network} ({complaint}" in problem.message
    assert problem.read == ("Settings reference", "CELERY_DEADLINES_TRUSTED_PROXIES")


@pytest.mark.parametrize("network", ["10.0.0.0/8", "fc00::/7", "104.16.0.0/13", "::1/128"])
def test_private_networks_and_a_cdns_ranges_are_not_too_wide(network: str) -> None:
    proxies = (ipaddress.ip_network(network),)
    assert review_settings(configured(trusted_proxies=proxies)) == []


# -- bad settings are E001's ---------------------------------------------------------------------


def test_nothing_is_checked_against_a_setting_that_is_itself_bad() -> None:
    unknown = configured(
        default_budget=UNKNOWN,
        budgets=UNKNOWN,
        contracts=UNKNOWN,
        default_reserve=UNKNOWN,
        default_attempt_timeout=UNKNOWN,
        max_budget=UNKNOWN,
        lease_ttl=UNKNOWN,
        ledger=UNKNOWN,
        trusted_proxies=UNKNOWN,
    )
    assert found({"reserve": 90, "delivery_budget": timedelta(days=30)}, unknown) == []
    assert review_settings(unknown) == []
    assert ids(found({"budget": -1}, unknown)) == ["E006"]  # the task's own value still is


# -- the same precedence as options.resolve ------------------------------------------------------


def _raw_settings(**raw: Any) -> conf.Settings:
    return conf.Settings({f"deadlines_{name}": value for name, value in raw.items()})


def _configured_from(settings: conf.Settings) -> Configured:
    get: Callable[[conf.Setting[Any]], Any] = settings.get
    return Configured(
        default_budget=get(conf.DEFAULT_BUDGET),
        budgets=get(conf.BUDGETS),
        contracts=get(conf.CONTRACTS),
        default_reserve=get(conf.DEFAULT_RESERVE),
        default_attempt_timeout=get(conf.DEFAULT_ATTEMPT_TIMEOUT),
        max_budget=get(conf.MAX_BUDGET),
        lease_ttl=get(conf.LEASE_TTL),
    )


_LEVELS = list(
    itertools.product(
        [{}, {"budget": 5}, {"budget": None}, {"reserve": 1, "attempt_timeout": None}],
        [{}, {"attempt_timeout": 2, "lease_ttl": 3}, {"budget": 8, "reserve": 0.5}],
        [None, 7],  # the task's time_limit
        [{}, {"budgets": {TASK: 4}}, {"budgets": {TASK: None}}],
        [
            {},
            {"default_budget": 6, "default_reserve": 0.25, "default_attempt_timeout": 1},
            {"lease_ttl": 2},
        ],
    )
)


@pytest.mark.parametrize(("own", "contract", "time_limit", "per_task", "defaults"), _LEVELS)
def test_a_tasks_durations_resolve_as_a_publish_resolves_them(
    own: dict[str, Any],
    contract: dict[str, Any],
    time_limit: float | None,
    per_task: dict[str, Any],
    defaults: dict[str, Any],
) -> None:
    settings = _raw_settings(contracts={TASK: contract} if contract else {}, **per_task, **defaults)
    declared = task(**own, time_limit=time_limit)
    resolved = Resolved(TASK, declared, _configured_from(settings))
    for option in ("budget", "reserve", "attempt_timeout", "lease_ttl"):
        said = getattr(resolved, option)()
        assert said is not None
        ours = said[1] if said[1] is not None or option == "budget" else timedelta(0)
        assert ours == options.resolve(declared, option, settings)[1], option


_VALUES = [-3, 0, 0.5, 5, timedelta(0), timedelta(seconds=-1), None, True, "10",
           float("nan"), float("inf"), 1e300, 10**400, timedelta(days=300)]  # fmt: skip


@pytest.mark.parametrize(("option", "value"), list(itertools.product(DURATIONS, _VALUES)))
def test_a_task_option_is_bad_exactly_when_a_publish_would_refuse_it(
    option: str, value: object
) -> None:
    settings = _raw_settings(max_budget=timedelta(days=36500))
    declared = task(**{option: value})
    ours = option in Resolved(TASK, declared, _configured_from(settings)).bad
    try:
        options.resolve(declared, option, settings)
    except Exception:  # noqa: BLE001 (whatever a publish would raise)
        theirs = True
    else:
        theirs = False
    assert ours == theirs
