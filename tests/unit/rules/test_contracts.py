"""Time contracts: parsed alone, then reviewed against the task they name."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from celery_deadlines.errors import InvalidDeadline
from celery_deadlines.rules.budgets import UNSET
from celery_deadlines.rules.contracts import OnExpiry, TimeContract, parse_contracts, review

NAME = "deadlines_contracts"
WEEK = timedelta(days=7)
ADDRESS = "shop.tasks.change_address"


def parse(contract: dict[str, Any]) -> TimeContract:
    return parse_contracts({ADDRESS: contract}, name=NAME, maximum=WEEK)[ADDRESS]


def test_the_seeds_address_change_contract_parses_into_durations_and_a_policy() -> None:
    contract = parse(
        {
            "budget": 120, "delivery_budget": 3600, "lease_ttl": 90,
            "observation_ttl": {"order_state": 30, "customer_confirmation": 300},
            "revalidate_before": ["order_state", "customer_confirmation"],
            "on_expiry": "refuse",
        }
    )  # fmt: skip
    assert contract.budget == timedelta(seconds=120)
    assert contract.delivery_budget == timedelta(hours=1)
    assert contract.lease_ttl == timedelta(seconds=90)
    assert contract.reserve is UNSET
    assert contract.observation_ttl["order_state"] == timedelta(seconds=30)
    assert contract.revalidate_before == ("order_state", "customer_confirmation")
    assert contract.on_expiry is OnExpiry.REFUSE
    assert contract.given() == ("budget", "delivery_budget", "lease_ttl")


def test_a_contract_may_opt_a_task_out_of_a_deadline_with_none() -> None:
    assert parse({"budget": None}).budget is None


@pytest.mark.parametrize(
    ("contract", "message"),
    [
        ({"budget": 60, "lease_ttl": 90}, r"address'\].lease_ttl .*longer than its budget"),
        ({"budget": 60, "attempt_timeout": 61}, r"attempt_timeout .*longer than its budget"),
        ({"budget": 60, "reserve": 60}, r"reserve .*leaves nothing"),
        ({"budget": 60, "timeout": 5}, r"unknown key\(s\) timeout; a contract may set budget"),
        ({"budget": -1}, r"budget must be more than zero"),
        ({"budget": 30 * 86400}, r"longer than the maximum budget"),
        ({"observation_ttl": {"order_state": 0}}, r"observation_ttl\['order_state'\] must be more"),
        ({"revalidate_before": ["order_state"]}, r"names order_state, which .* no"),
        ({"revalidate_before": "order_state"}, r"must be a list of observation sources"),
        ({"on_expiry": "retry"}, r"on_expiry must be one of revalidate, pause, refuse, escalate"),
        ({"on_expiry": ["refuse"]}, r"on_expiry must be one of"),
    ],
    ids=[
        "lease-longer-than-budget", "attempt-longer-than-budget", "reserve-eats-budget",
        "unknown-key", "negative-budget", "absurd-budget", "zero-ttl", "revalidate-unknown",
        "revalidate-string", "bad-on-expiry", "unhashable-on-expiry",
    ],
)  # fmt: skip
def test_a_contract_that_cannot_work_is_refused_naming_the_task_and_key(
    contract: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidDeadline, match=message):
        parse(contract)


def test_contracts_must_be_a_mapping_of_task_names() -> None:
    with pytest.raises(InvalidDeadline, match="must map task names"):
        parse_contracts([("x", {})], name=NAME, maximum=WEEK)
    with pytest.raises(InvalidDeadline, match="must be a mapping"):
        parse_contracts({ADDRESS: 120}, name=NAME, maximum=WEEK)


def task(**attributes: Any) -> Any:
    defaults = {
        "budget": UNSET, "delivery_budget": UNSET, "reserve": UNSET,
        "attempt_timeout": UNSET, "lease_ttl": UNSET, "time_limit": None,
        "soft_time_limit": None, "autoretry_for": (), "retry_backoff": False,
        "retry_backoff_max": 600, "default_retry_delay": 180,
        "lease_duration": lambda: None,  # what marks a DeadlineTask
    }  # fmt: skip
    return SimpleNamespace(**{**defaults, **attributes})


def problems(
    contract: dict[str, Any], broker: str = "redis://", vt: Any = None, **attrs: Any
) -> list[str]:
    contracts = parse_contracts({ADDRESS: contract}, name=NAME, maximum=WEEK)
    options = {} if vt is None else {"visibility_timeout": vt}
    registry = {ADDRESS: task(**attrs)}
    found = review(contracts, registry, broker, options, setting="CELERY_DEADLINES_CONTRACTS")
    return [problem.message for problem in found]


def test_a_sound_contract_has_no_problem_with_its_task() -> None:
    assert problems({"budget": 120, "lease_ttl": 30}, time_limit=60) == []


def test_a_time_limit_longer_than_the_budget_is_a_problem() -> None:
    [message] = problems({"budget": 60}, time_limit=300)
    assert "CELERY_DEADLINES_CONTRACTS['shop.tasks.change_address']" in message
    assert "time_limit (300 s) is longer than the contract's budget (60 s)" in message


def test_a_retry_backoff_beyond_the_visibility_timeout_is_a_problem_on_redis_only() -> None:
    contract = {"budget": 3600}
    [message] = problems(contract, vt=300, autoretry_for=(OSError,), retry_backoff=True)
    assert "a retry may wait up to 600 s (retry_backoff_max)" in message
    assert "visibility_timeout (300 s)" in message
    retrying: dict[str, Any] = {"autoretry_for": (OSError,), "retry_backoff": True}
    assert problems(contract, broker="amqp://", vt=300, **retrying) == []
    assert problems(contract, vt=900, **retrying) == []


def test_a_value_given_both_on_the_task_and_in_its_contract_is_a_problem() -> None:
    [message] = problems({"budget": 60}, budget=30)
    assert ".budget is also set on the task itself (30)" in message


def test_a_contract_for_a_task_nobody_registered_is_a_problem() -> None:
    typo = {"shop.tasks.chnage_address": {"budget": 60}}
    contracts = parse_contracts(typo, name=NAME, maximum=WEEK)
    [problem] = review(contracts, {ADDRESS: task()}, "redis://", {}, setting=NAME)
    assert "names no registered task" in problem.message


def test_a_contract_for_a_plain_celery_task_is_a_problem() -> None:
    contracts = parse_contracts({ADDRESS: {"budget": 60}}, name=NAME, maximum=WEEK)
    plain = SimpleNamespace(name=ADDRESS)
    [problem] = review(contracts, {ADDRESS: plain}, "redis://", {}, setting=NAME)
    assert "is not a DeadlineTask" in problem.message


def test_sqs_has_its_own_default_visibility_timeout() -> None:
    retrying: dict[str, Any] = {"autoretry_for": (OSError,), "retry_backoff": True}
    assert problems({"budget": 3600}, broker="sqs://", retry_backoff_max=2000, **retrying)
    assert not problems({"budget": 3600}, broker="redis://", retry_backoff_max=2000, **retrying)


def test_a_backoff_on_a_task_that_never_retries_by_itself_is_not_a_problem() -> None:
    assert problems({"budget": 3600}, vt=300, retry_backoff=True) == []
