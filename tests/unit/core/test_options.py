"""A DeadlineTask's durations from the one precedence rule, level by level (no broker)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_deadlines import DeadlineTask, InvalidDeadline
from celery_deadlines.conf import settings_for
from celery_deadlines.core.options import resolve, times
from celery_deadlines.rules.budgets import UNSET


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("options", broker="memory://", set_as_current=False)
    yield app
    app.close()


def task_of(app: Celery, name: str = "opts.work", **options: Any) -> Any:
    @app.task(base=DeadlineTask, bind=True, name=name, shared=False, **options)
    def work(self: DeadlineTask) -> None:
        return None

    return work


@pytest.mark.parametrize(
    ("attribute", "contract", "per_task", "default", "expected"),
    [
        (20, 40, 60, 80, ("task", 20)),
        (UNSET, 40, 60, 80, ("setting", 40)),
        (UNSET, UNSET, 60, 80, ("setting", 60)),
        (UNSET, UNSET, UNSET, 80, ("default", 80)),
        (None, 40, 60, 80, ("task", None)),  # a task opts out of every deadline
    ],
)
def test_a_budget_comes_from_task_then_contract_then_per_task_then_default(
    app: Celery,
    attribute: object,
    contract: object,
    per_task: object,
    default: object,
    expected: tuple[str, int | None],
) -> None:
    if contract is not UNSET:
        app.conf.deadlines_contracts = {"opts.work": {"budget": contract}}
    if per_task is not UNSET:
        app.conf.deadlines_budgets = {"opts.work": per_task}
    app.conf.deadlines_default_budget = default
    task = task_of(app) if attribute is UNSET else task_of(app, budget=attribute)
    source, value = resolve(task, "budget", settings_for(app))
    seconds = None if value is None else int(value.total_seconds())
    assert (source, seconds) == expected


def test_the_attempt_timeout_falls_back_to_celerys_time_limits_after_the_contract(
    app: Celery,
) -> None:
    settings = settings_for(app)
    hard, soft = (
        task_of(app, "opts.hard", time_limit=30),
        task_of(app, "opts.soft", soft_time_limit=12),
    )
    assert resolve(hard, "attempt_timeout", settings)[1] == timedelta(seconds=30)
    assert resolve(soft, "attempt_timeout", settings)[1] == timedelta(seconds=12)
    app.conf.deadlines_contracts = {"opts.hard": {"attempt_timeout": 10}}
    assert resolve(hard, "attempt_timeout", settings)[1] == timedelta(seconds=10)


def test_an_attempt_timeout_of_none_means_ask_the_next_level_not_no_limit(app: Celery) -> None:
    task = task_of(app, attempt_timeout=None, time_limit=7)
    assert resolve(task, "attempt_timeout", settings_for(app))[1] == timedelta(seconds=7)


def test_nothing_said_anywhere_means_no_reserve_and_no_attempt_timeout(app: Celery) -> None:
    task = task_of(app)
    assert resolve(task, "reserve", settings_for(app))[1] == timedelta(0)
    assert resolve(task, "attempt_timeout", settings_for(app))[1] == timedelta(0)


def test_a_bad_task_attribute_is_refused_naming_the_task_and_the_option(app: Celery) -> None:
    with pytest.raises(InvalidDeadline, match=r"opts\.work\.lease_ttl"):
        resolve(task_of(app, lease_ttl=-1), "lease_ttl", settings_for(app))


def test_a_task_attribute_is_parsed_once_per_value(app: Celery) -> None:
    task = task_of(app, budget=20)
    settings = settings_for(app)
    first = resolve(task, "budget", settings)[1]
    assert resolve(task, "budget", settings)[1] is first  # the cached parse
    task.budget = 25
    assert resolve(task, "budget", settings)[1] == timedelta(seconds=25)


def test_a_tasks_times_are_kept_while_its_settings_and_attributes_stay_the_same(
    app: Celery,
) -> None:
    task = task_of(app, budget=20)
    settings = settings_for(app)
    kept = times(task, settings)
    assert kept.resolve("budget") == ("task", timedelta(seconds=20))
    assert times(task, settings) is kept
    task.budget = 25  # an attribute changed: worked out again
    again = times(task, settings)
    assert again is not kept
    assert again.resolve("budget") == ("task", timedelta(seconds=25))


def test_a_setting_set_at_run_time_takes_effect_at_the_next_read_of_a_tasks_times(
    app: Celery,
) -> None:
    task = task_of(app)
    settings = settings_for(app)
    app.conf.deadlines_default_reserve = 2
    assert times(task, settings).duration("reserve") == timedelta(seconds=2)
    app.conf.deadlines_default_reserve = 3  # the same key again: only its value changes
    assert times(task, settings).duration("reserve") == timedelta(seconds=3)
    app.conf.deadlines_default_reserve = 0
    assert times(task, settings).duration("reserve") == timedelta(0)


def test_a_reload_makes_a_tasks_times_be_worked_out_again(app: Celery) -> None:
    task = task_of(app)
    settings = settings_for(app)
    kept = times(task, settings)
    settings.reload()  # what Django's override_settings does
    assert times(task, settings) is not kept


def test_the_settings_stamp_changes_only_when_a_setting_of_this_package_may_have(
    app: Celery,
) -> None:
    settings = settings_for(app)
    first = settings.stamp()
    app.conf.broker_pool_limit = 3  # not one of this package's settings
    assert settings.stamp() == first
    app.conf.deadlines_default_budget = 30
    with_budget = settings.stamp()
    assert with_budget != first
    assert settings.stamp() == with_budget
    app.conf.deadlines_default_budget = 40
    assert settings.stamp() != with_budget
    settings.reload()
    assert settings.stamp() not in (first, with_budget)


def test_times_answer_only_for_the_durations_they_keep(app: Celery) -> None:
    with pytest.raises(ValueError, match="lease_ttl"):
        times(task_of(app), settings_for(app)).resolve("lease_ttl")


def test_a_publish_names_nothing_only_without_budgets_call_options_or_a_header(
    app: Celery,
) -> None:
    settings = settings_for(app)
    silent = times(task_of(app, "opts.none", budget=None), settings)
    assert silent.name_nothing({"queue": "q", "headers": {"x_other": 1}})
    assert not silent.name_nothing({"budget": 5})
    assert not silent.name_nothing({"headers": {"x_deadline": 1.0}})
    assert not times(task_of(app, "opts.some", budget=5), settings).name_nothing({})
    notice = task_of(app, "opts.notice", budget=None, delivery_budget=60)
    assert not times(notice, settings).name_nothing({})
