"""DeadlineTask and DeadlineRequest driven directly, on a fake clock and the memory broker.

No server and no sleeping: the clock is moved by hand. These tests prove the glue; the
same behaviours are proven across real processes in tests/integration.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Ignore, Retry

from celery_deadlines import (
    DEADLINE_HEADER,
    DELIVERY_DEADLINE_HEADER,
    SOURCE_HEADER,
    ConfigurationError,
    DeadlineRefused,
    InvalidDeadline,
    ReservedHeader,
)
from celery_deadlines.rules.gates import Decision
from celery_deadlines.rules.stamping import PROTOCOL_HEADERS
from celery_deadlines.rules.wire import encode
from celery_deadlines.testing import FakeClock
from tests.support.unit_tasks import claim, make_task, start_attempt, stored_refusal

# -- enqueue: stamping and precedence ---------------------------------------------------


def test_call_budget_is_stamped_as_an_absolute_deadline_without_celerys_expires(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    # the worker's claim gate refuses it when it is handed to the pool, at arrival
    make_task(app).apply_async(budget=30)
    headers = published[-1]
    assert headers[DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=30))
    assert headers[SOURCE_HEADER] == "call"
    assert headers.get("expires") is None


@pytest.mark.parametrize("option", ["countdown", "eta"])
def test_a_message_that_waits_for_its_eta_carries_the_deadline_as_expires(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]], option: str
) -> None:
    # Celery then checks it on arrival, not only when the ETA comes
    delay = (
        {"countdown": 5} if option == "countdown" else {"eta": clock.now() + timedelta(seconds=5)}
    )
    make_task(app).apply_async(budget=30, **delay)
    assert published[-1]["expires"] == (clock.now() + timedelta(seconds=30)).isoformat()


def test_call_deadline_is_used_as_given(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    deadline = clock.now() + timedelta(minutes=3)
    make_task(app).apply_async(deadline=deadline)
    assert published[-1][DEADLINE_HEADER] == encode(deadline)


def test_call_overrides_task_attribute(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    make_task(app, budget=60).apply_async(budget=5)
    assert published[-1][DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=5))


def test_task_attribute_overrides_per_task_setting(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    app.conf.deadlines_budgets = {"unit.work": 90}
    make_task(app, budget=timedelta(seconds=45)).delay()
    assert published[-1][DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=45))
    assert published[-1][SOURCE_HEADER] == "task"


def test_per_task_setting_overrides_default_setting(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    app.conf.deadlines_budgets = {"unit.work": 90}
    app.conf.deadlines_default_budget = 10
    make_task(app).delay()
    assert published[-1][DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=90))
    assert published[-1][SOURCE_HEADER] == "setting"


def test_default_setting_applies_when_nothing_else_says(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    app.conf.deadlines_default_budget = timedelta(seconds=10)
    make_task(app).delay()
    assert published[-1][SOURCE_HEADER] == "default"


def test_no_budget_anywhere_means_no_deadline_header(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    make_task(app).delay()
    assert DEADLINE_HEADER not in published[-1]
    assert published[-1].get("expires") is None


def test_task_attribute_none_opts_out_of_the_default(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    app.conf.deadlines_default_budget = 10
    make_task(app, budget=None).delay()
    assert DEADLINE_HEADER not in published[-1]


def test_a_publish_with_no_deadline_anywhere_reads_no_clock(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]], monkeypatch: Any
) -> None:
    reads: list[str] = []
    read = clock.now

    def counted() -> Any:
        reads.append("now")
        return read()

    monkeypatch.setattr(clock, "now", counted)
    make_task(app, budget=None).delay()
    assert reads == []
    assert DEADLINE_HEADER not in published[-1]
    make_task(app, name="unit.budgeted", budget=5).delay()
    assert reads == ["now"]


def test_a_call_option_naming_no_instant_leaves_a_task_without_budget_unstamped(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    make_task(app, budget=None).apply_async(budget=None, delivery_deadline=None)
    assert DEADLINE_HEADER not in published[-1]


def test_settings_are_read_lazily_so_a_change_takes_effect_at_once(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    task = make_task(app)
    app.conf.deadlines_default_budget = 10
    task.delay()
    app.conf.deadlines_default_budget = 20
    task.delay()
    assert published[-1][DEADLINE_HEADER] - published[-2][DEADLINE_HEADER] == 10


def test_bad_setting_raises_a_configuration_error_naming_the_setting(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    app.conf.deadlines_default_budget = "thirty"
    with pytest.raises(ConfigurationError, match="CELERY_DEADLINES_DEFAULT_BUDGET"):
        make_task(app).delay()
    assert published == []


def test_bad_per_task_setting_names_the_task(app: Celery, clock: FakeClock) -> None:
    app.conf.deadlines_budgets = {"unit.work": -3}
    with pytest.raises(ConfigurationError, match=r"deadlines_budgets\['unit.work'\]"):
        make_task(app).delay()


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"budget": -1}, "more than zero"),
        ({"budget": float("nan")}, "finite"),
        ({"budget": timedelta(days=400)}, "maximum budget"),
        ({"deadline": "tomorrow"}, "aware datetime"),
        ({"budget": 5, "deadline": None, "delivery_budget": -2}, "delivery_budget"),
    ],
)
def test_bad_call_options_raise_and_publish_nothing(
    app: Celery,
    clock: FakeClock,
    published: list[dict[str, Any]],
    options: dict[str, Any],
    complaint: str,
) -> None:
    with pytest.raises(InvalidDeadline, match=complaint):
        make_task(app).apply_async(**options)
    assert published == []


@pytest.mark.parametrize("header", sorted(PROTOCOL_HEADERS))
def test_a_header_naming_a_field_of_celerys_own_message_is_refused_and_nothing_is_published(
    app: Celery, published: list[dict[str, Any]], header: str
) -> None:
    task = make_task(app)
    with pytest.raises(ReservedHeader, match=rf"sets {header}, .*\({header}: "):
        task.apply_async(headers={header: "run-of-another-task", "tenant": "acme"})
    with pytest.raises(ReservedHeader):  # the same on the path of a budget of its own
        task.apply_async(budget=30, headers={header: "run-of-another-task"})
    assert published == []


def test_a_publishers_own_headers_are_published_as_given(
    app: Celery, published: list[dict[str, Any]]
) -> None:
    make_task(app).apply_async(task_id="r-1", headers={"tenant": "acme", "ID": "x"})
    [headers] = published
    assert (headers["id"], headers["tenant"], headers["ID"]) == ("r-1", "acme", "x")


def test_naive_deadline_raises_and_publishes_nothing(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    with pytest.raises(InvalidDeadline, match="naive"):
        make_task(app).apply_async(deadline=clock.now().replace(tzinfo=None))
    assert published == []


def test_budget_and_deadline_together_are_refused(app: Celery, clock: FakeClock) -> None:
    with pytest.raises(InvalidDeadline, match="not both"):
        make_task(app).apply_async(budget=5, deadline=clock.now())


def test_enqueue_of_a_past_deadline_raises_refused_and_publishes_nothing(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]], refusals: list[Decision]
) -> None:
    with pytest.raises(DeadlineRefused) as raised:
        make_task(app).apply_async(deadline=clock.now() - timedelta(seconds=1))
    assert (raised.value.gate, raised.value.reason) == ("enqueue", "deadline_passed")
    assert published == []
    assert [d.reason for d in refusals] == ["deadline_passed"]


def test_enqueue_below_the_reserve_raises_insufficient_budget(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    with pytest.raises(DeadlineRefused, match="insufficient_budget"):
        make_task(app, reserve=5).apply_async(budget=4)
    assert published == []


def test_reserve_from_settings_applies_to_tasks_that_name_none(
    app: Celery, clock: FakeClock
) -> None:
    app.conf.deadlines_default_reserve = 10
    with pytest.raises(DeadlineRefused, match="insufficient_budget"):
        make_task(app).apply_async(budget=9)


def test_enqueue_with_a_countdown_beyond_the_deadline_is_refused(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    with pytest.raises(DeadlineRefused, match="deadline_passed"):
        make_task(app).apply_async(budget=5, countdown=6)
    assert published == []


def test_delivery_budget_is_stamped_separately(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    make_task(app).apply_async(budget=5, delivery_budget=3600)
    headers = published[-1]
    assert headers[DELIVERY_DEADLINE_HEADER] == encode(clock.now() + timedelta(hours=1))
    assert headers[DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=5))


def test_an_earlier_celery_expires_is_kept(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    make_task(app).apply_async(budget=30, expires=10)
    assert published[-1]["expires"] == (clock.now() + timedelta(seconds=10)).isoformat()


def test_an_earlier_celery_expires_shortens_the_deadline_as_a_shorter_budget_would(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    task = make_task(app, budget=8)
    task.apply_async(expires=3)
    headers = published[-1]
    assert headers[DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=3))
    assert headers[SOURCE_HEADER] == "expires"
    start_attempt(task, headers)
    assert task.remaining() == pytest.approx(3)  # not the 8 s Celery would never give it


def test_the_tasks_own_expires_shortens_the_deadline_unless_the_call_clears_it(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    task = make_task(app, budget=8, expires=2)
    task.apply_async()
    assert published[-1][DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=2))
    task.apply_async(expires=None)  # Celery's own merge: an explicit None clears it
    assert published[-1][DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=8))


def test_a_later_celery_expires_never_extends_the_deadline(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    make_task(app, budget=8).apply_async(expires=clock.now() + timedelta(minutes=5))
    headers = published[-1]
    assert headers[DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=8))
    assert headers[SOURCE_HEADER] == "task"
    assert headers["expires"] == (clock.now() + timedelta(seconds=8)).isoformat()


# -- attempt: anchoring, remaining(), refusal at start ---------------------------------


def test_remaining_is_measured_on_the_monotonic_clock_from_the_attempt_start(
    app: Celery, clock: FakeClock
) -> None:
    task = make_task(app)
    start_attempt(task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=10))})
    clock.advance(4)
    assert task.remaining() == pytest.approx(6)


def test_a_wall_clock_jump_backward_mid_attempt_adds_no_time(app: Celery, clock: FakeClock) -> None:
    task = make_task(app)
    start_attempt(task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=10))})
    clock.advance(2)
    clock.jump_wall(-3600)
    assert task.remaining() == pytest.approx(8)


def test_a_wall_clock_jump_forward_mid_attempt_removes_no_time(
    app: Celery, clock: FakeClock
) -> None:
    task = make_task(app)
    start_attempt(task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=10))})
    clock.jump_wall(+3600)
    assert task.remaining() == pytest.approx(10)


def test_remaining_without_a_deadline_is_infinite(app: Celery, clock: FakeClock) -> None:
    task = make_task(app)
    start_attempt(task, {})
    assert task.remaining() == float("inf")
    assert task.deadline is None


def test_attempt_refuses_to_start_after_the_deadline_and_stores_why(
    app: Celery, clock: FakeClock, refusals: list[Decision]
) -> None:
    task = make_task(app)
    with pytest.raises(Ignore):
        start_attempt(task, {DEADLINE_HEADER: encode(clock.now() - timedelta(seconds=1))}, "t-2")
    stored = stored_refusal(app, "t-2")
    assert (stored.gate, stored.reason) == ("attempt", "deadline_passed")
    assert [d.gate for d in refusals] == ["attempt"]


def test_attempt_tells_a_deadline_that_was_its_expires_as_celery_tells_an_expiry(
    app: Celery, clock: FakeClock, refusals: list[Decision]
) -> None:
    from celery.exceptions import TaskRevokedError

    task = make_task(app)
    past = encode(clock.now() - timedelta(seconds=1))
    with pytest.raises(Ignore):
        start_attempt(task, {DEADLINE_HEADER: past, SOURCE_HEADER: "expires"}, "t-4")
    result = app.AsyncResult("t-4")
    assert str(result.state) == "REVOKED"
    assert isinstance(result.result, TaskRevokedError)
    assert str(result.result) == "expired"
    assert [(d.gate, d.reason) for d in refusals] == [("attempt", "deadline_passed")]


@pytest.mark.parametrize("header", ["garbage", float("nan"), -5.0, "2026-11-29T12:00:00", [1]])
def test_attempt_refuses_a_malformed_header_as_invalid_deadline(
    app: Celery, clock: FakeClock, header: object
) -> None:
    task = make_task(app)
    with pytest.raises(Ignore):
        start_attempt(task, {DEADLINE_HEADER: header}, "t-3")
    assert stored_refusal(app, "t-3").reason == "invalid_deadline"


# -- retry ------------------------------------------------------------------------------


def test_retry_is_refused_when_backoff_exceeds_remaining_budget(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    task = make_task(app, attempt_timeout=1)
    start_attempt(task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=5))})
    clock.advance(2)
    with pytest.raises(DeadlineRefused) as raised:
        task.retry(countdown=3, exc=RuntimeError("provider down"))
    assert raised.value.reason == "retry_budget_exhausted"
    assert "provider down" in raised.value.detail
    assert published == []


def test_retry_that_fits_is_published_with_the_same_absolute_deadline(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    task = make_task(app, attempt_timeout=1)
    deadline = encode(clock.now() + timedelta(seconds=30))
    start_attempt(task, {DEADLINE_HEADER: deadline, SOURCE_HEADER: "call"})
    clock.advance(5)
    with pytest.raises(Retry):
        task.retry(countdown=3)
    assert published[-1][DEADLINE_HEADER] == deadline


def test_retry_uses_time_limit_when_no_attempt_timeout_is_named(
    app: Celery, clock: FakeClock
) -> None:
    task = make_task(app, time_limit=20)
    start_attempt(task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=15))})
    with pytest.raises(DeadlineRefused, match=r"attempt timeout 20\.000 s"):
        task.retry(countdown=0)


def test_retry_under_an_app_wide_time_limit_reserves_no_attempt_timeout(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    """cookiecutter-django's CELERY_TASK_TIME_LIMIT = 300 is a safety cap for every task,
    not what one attempt of this one takes: a retry under a shorter deadline is admitted
    (Celery 5.7 copies the setting onto every task that declares no limit of its own,
    and every such retry was refused: "a retry needs 300.1 s")."""
    app.conf.update(task_time_limit=300, task_soft_time_limit=60)
    task = make_task(app, "unit.cookiecutter")
    start_attempt(task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=15))})
    with pytest.raises(Retry):
        task.retry(countdown=1)
    assert task._attempt_duration() == timedelta(0)
    declared = make_task(app, "unit.declared", time_limit=20)
    assert declared._attempt_duration() == timedelta(seconds=20)
    soft_only = make_task(app, "unit.soft", soft_time_limit=15)
    assert soft_only._attempt_duration() == timedelta(seconds=15)  # its own soft, not 300


def test_retry_with_an_eta_counts_the_wait_until_the_eta(app: Celery, clock: FakeClock) -> None:
    task = make_task(app)
    start_attempt(task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=15))})
    with pytest.raises(DeadlineRefused, match=r"countdown 20\.000 s"):
        task.retry(eta=clock.now() + timedelta(seconds=20))


def test_retry_honours_the_reserve_so_the_retried_message_is_never_refused_at_enqueue(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    task = make_task(app, reserve=4, attempt_timeout=1)
    start_attempt(task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=6))})
    with pytest.raises(DeadlineRefused, match="retry_budget_exhausted"):
        task.retry(countdown=3)
    assert published == []


def test_retry_past_max_retries_is_left_to_celery(app: Celery, clock: FakeClock) -> None:
    task = make_task(app, max_retries=0)
    start_attempt(task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=1))})
    with pytest.raises(RuntimeError, match="original"):
        task.retry(countdown=60, exc=RuntimeError("original"))


def test_eager_mode_runs_the_same_gates_in_process(app: Celery, clock: FakeClock) -> None:
    app.conf.task_always_eager = True
    task = make_task(app, name="unit.eager")
    assert task.apply_async(budget=5).get() == pytest.approx(5)
    with pytest.raises(DeadlineRefused, match="enqueue gate refused: deadline_passed"):
        task.apply_async(deadline=clock.now() - timedelta(seconds=1))


# -- delivery tasks: governed by the delivery deadline, not the execution deadline -----


def test_a_delivery_task_published_from_a_run_lives_by_the_runs_delivery_deadline(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    from celery._state import _task_stack  # type: ignore[attr-defined]

    parent = make_task(app, name="unit.order")
    notice = make_task(app, name="unit.notice", deadline_kind="delivery")
    execution = clock.now() + timedelta(seconds=10)
    delivery = clock.now() + timedelta(hours=1)
    start_attempt(
        parent,
        {DEADLINE_HEADER: encode(execution), DELIVERY_DEADLINE_HEADER: encode(delivery)},
    )
    _task_stack.push(parent)
    try:
        notice.delay()
    finally:
        _task_stack.pop()
    assert published[-1][DEADLINE_HEADER] == encode(delivery)
    assert published[-1][DELIVERY_DEADLINE_HEADER] == encode(delivery)


def test_a_delivery_task_may_start_after_execution_expired_while_delivery_is_valid(
    app: Celery, clock: FakeClock
) -> None:
    notice = make_task(app, name="unit.notice", deadline_kind="delivery")
    delivery = clock.now() + timedelta(hours=1)
    start_attempt(notice, {DEADLINE_HEADER: encode(delivery)}, "n-1")
    assert notice.remaining() == pytest.approx(3600)


def test_a_delivery_task_past_its_deadline_is_refused_as_delivery_expired(
    app: Celery, clock: FakeClock, refusals: list[Decision]
) -> None:
    notice = make_task(app, name="unit.notice", deadline_kind="delivery")
    request, on_ack = claim(
        app, notice, {DEADLINE_HEADER: encode(clock.now() - timedelta(seconds=1))}
    )
    assert request.revoked()
    on_ack.assert_called_once()
    assert stored_refusal(app, "m-1").reason == "delivery_expired"
    assert [d.reason for d in refusals] == ["delivery_expired"]


def test_an_execution_task_past_its_deadline_is_still_refused_as_deadline_passed(
    app: Celery, clock: FakeClock
) -> None:
    task = make_task(app)
    request, _ = claim(app, task, {DEADLINE_HEADER: encode(clock.now() - timedelta(seconds=1))})
    assert request.revoked()
    assert stored_refusal(app, "m-1").reason == "deadline_passed"


# -- time contracts (deadlines_contracts) -----------------------------------------------


def test_a_contract_gives_the_budgets_when_the_task_names_none(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    app.conf.deadlines_budgets = {"unit.work": 90}  # the contract is the closer word
    app.conf.deadlines_contracts = {"unit.work": {"budget": 40, "delivery_budget": 600}}
    make_task(app).delay()
    assert published[-1][DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=40))
    assert published[-1][DELIVERY_DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=600))
    assert published[-1][SOURCE_HEADER] == "setting"


def test_the_task_option_and_the_call_still_override_a_contract(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    app.conf.deadlines_contracts = {"unit.work": {"budget": 40}}
    task = make_task(app, budget=20)
    task.delay()
    assert published[-1][DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=20))
    task.apply_async(budget=5)
    assert published[-1][DEADLINE_HEADER] == encode(clock.now() + timedelta(seconds=5))


def test_a_contract_gives_the_reserve_the_lease_and_the_attempt_timeout(app: Celery) -> None:
    app.conf.deadlines_contracts = {
        "unit.work": {"budget": 120, "reserve": 2, "lease_ttl": 45, "attempt_timeout": 10}
    }
    task = make_task(app, time_limit=30)
    assert task._reserve_duration() == timedelta(seconds=2)
    assert task.lease_duration() == timedelta(seconds=45)
    assert task._attempt_duration() == timedelta(seconds=10)  # the contract's, not time_limit


def test_a_contract_that_cannot_work_raises_naming_the_setting_task_and_key(
    app: Celery, clock: FakeClock
) -> None:
    app.conf.deadlines_contracts = {"unit.work": {"budget": 60, "lease_ttl": 90}}
    with pytest.raises(ConfigurationError, match=r"deadlines_contracts\['unit.work'\].lease_ttl"):
        make_task(app).delay()
