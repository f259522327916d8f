"""A DeadlineTask's malformed message in the worker's main process, through Celery's own
strategy (tests/support/main_process.py), on a fake clock: refused with
``invalid_message`` (when Celery cannot make its request, when the worker hands it to
the pool, or whenever it is refused), acknowledged, its refusal stored only under an id
that can name a result; never an exception out of the consumer."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from unittest.mock import Mock

import pytest
from celery import Celery
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_deadlines import DEADLINE_HEADER
from celery_deadlines.rules.gates import Decision
from celery_deadlines.rules.wire import encode
from celery_deadlines.testing import FakeClock, FakeLedger, use_ledger
from tests.support.main_process import MainProcess, celery_headers
from tests.support.unit_tasks import make_task, stored_refusal

MISSING = object()


@pytest.fixture
def task(app: Celery) -> Any:
    return make_task(app, time_limit=60, soft_time_limit=50)


@pytest.fixture
def main(app: Celery, task: Any) -> MainProcess:
    return MainProcess(app, task)


@pytest.fixture
def stored(app: Celery, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The task ids the result backend was asked to store a result under."""
    ids: list[object] = []
    original = app.backend.store_result

    def store_result(task_id: Any, *args: Any, **kwargs: Any) -> Any:
        ids.append(task_id)
        return original(task_id, *args, **kwargs)

    monkeypatch.setattr(app.backend, "store_result", store_result)
    return ids


def headers(app: Celery, task: Any, clock: FakeClock, **fields: Any) -> dict[str, Any]:
    """Celery's headers for a message of ``task`` whose deadline passed a second ago,
    with ``fields`` over them (``MISSING``: left out)."""
    passed = {DEADLINE_HEADER: encode(clock.now() - timedelta(seconds=1))}
    made = celery_headers(app, task.name, "m-1", **passed, **fields)
    return {key: value for key, value in made.items() if value is not MISSING}


def assert_refused_as_invalid(
    main: MainProcess, delivery: Any, refusals: list[Decision], *words: str
) -> Decision:
    assert delivery.acks == 1
    assert delivery.rejects == []
    assert main.pool.handed == []
    [decision] = refusals
    assert (decision.gate, decision.reason) == ("claim", "invalid_message")
    for word in words:
        assert word in decision.detail
    return decision


@pytest.mark.parametrize("task_id", [5, None, [1], {"a": 1}, "", MISSING])
def test_a_refused_message_whose_id_is_not_a_task_id_is_acknowledged_and_nothing_is_stored(
    app: Celery,
    task: Any,
    main: MainProcess,
    clock: FakeClock,
    refusals: list[Decision],
    stored: list[object],
    task_id: object,
) -> None:
    # Before: the refusal of its passed deadline stored its failure under the id in the
    # worker's main process (TypeError, ValueError: the worker stopped), or Celery's
    # revocation check hashed it (a list: TypeError), or its request read it (none:
    # KeyError, the consumer reconnecting for ever)
    delivery = main.deliver(headers(app, task, clock, id=task_id))
    decision = assert_refused_as_invalid(main, delivery, refusals, "id")
    assert "nothing is stored" in decision.detail
    assert stored == []


@pytest.mark.parametrize(
    "limits",
    [["x", "y"], 5, [1, 2, 3], "ab", {"a": 1}, [-1, None], [float("nan"), None], [True, None]],
)
def test_a_timelimit_that_is_not_two_durations_is_refused_and_stored(
    app: Celery,
    task: Any,
    main: MainProcess,
    clock: FakeClock,
    refusals: list[Decision],
    limits: object,
) -> None:
    # Before: the time-limit cap compared them with the deadline's budget (TypeError in
    # the main process), or the request's setter unpacked them (ValueError)
    deadline = {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=20))}
    delivery = main.deliver(celery_headers(app, task.name, "m-1", timelimit=limits, **deadline))
    assert_refused_as_invalid(main, delivery, refusals, "timelimit")
    assert stored_refusal(app, "m-1").reason == "invalid_message"
    # a pair of durations is the message's own, capped at the deadline
    main.deliver(celery_headers(app, task.name, "m-2", timelimit=[30, 6], **deadline))
    [handed] = main.pool.handed
    assert (handed.task_id, handed.hard, handed.soft) == ("m-2", 20, 4)


@pytest.mark.parametrize("retries", ["x", [1], 1.5, -1, 2**31, 10**30, True])
def test_retries_that_are_not_an_attempt_number_are_refused(
    app: Celery,
    task: Any,
    main: MainProcess,
    clock: FakeClock,
    refusals: list[Decision],
    retries: object,
) -> None:
    delivery = main.deliver(celery_headers(app, task.name, "m-1", retries=retries))
    assert_refused_as_invalid(main, delivery, refusals, "retries")
    assert stored_refusal(app, "m-1").reason == "invalid_message"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("shadow", [1]),
        ("shadow", 5),
        ("parent_id", 5),
        ("root_id", "r" * 256),
        ("group", {"g": 1}),
        ("group_index", "x"),
        ("stamped_headers", 5),
        ("stamps", 5),
        ("eta", 5),
        # Celery's request read these as no instant and then asked it for its zone
        # (AttributeError, in the main process)
        ("expires", []),
        ("expires", ""),
    ],
)
def test_a_name_stamp_or_instant_of_another_type_is_refused(
    app: Celery,
    task: Any,
    main: MainProcess,
    clock: FakeClock,
    refusals: list[Decision],
    field: str,
    value: object,
) -> None:
    delivery = main.deliver(headers(app, task, clock, **{field: value}))
    assert_refused_as_invalid(main, delivery, refusals, field)
    assert stored_refusal(app, "m-1").reason == "invalid_message"


@pytest.mark.parametrize(
    "body",
    [
        "x",
        5,
        [[], {}],
        [5, {}, None],
        [[], 5, None],
        [[], {}, 5],
        [[], {}, {"errbacks": 5}],
        [[], {}, {"callbacks": [5]}],
        [[], {}, {"chord": 5}],
    ],
)
def test_a_body_that_is_not_celerys_is_refused(
    app: Celery,
    task: Any,
    main: MainProcess,
    clock: FakeClock,
    refusals: list[Decision],
    body: object,
) -> None:
    # Before: Celery's request unpacked it (ValueError), or the refusal of its passed
    # deadline told its errbacks (TypeError), in the main process
    delivery = main.deliver(headers(app, task, clock), body)
    assert_refused_as_invalid(main, delivery, refusals)
    assert stored_refusal(app, "m-1").reason == "invalid_message"


@pytest.mark.parametrize(("field", "value"), [("eta", "soon"), ("expires", "2030-13-45")])
def test_an_eta_or_expires_celery_cannot_read_is_refused_with_celerys_words(
    app: Celery,
    task: Any,
    main: MainProcess,
    clock: FakeClock,
    refusals: list[Decision],
    field: str,
    value: object,
) -> None:
    # Before: Celery's InvalidTaskError, the message rejected and nothing stored
    delivery = main.deliver(celery_headers(app, task.name, "m-1", **{field: value}))
    decision = assert_refused_as_invalid(main, delivery, refusals, "Celery cannot read it")
    assert f"invalid {field}".lower() in decision.detail.lower()
    assert stored_refusal(app, "m-1").reason == "invalid_message"


def test_a_shadow_that_is_not_a_name_is_refused_before_a_pool_process_accepts_it(
    app: Celery, task: Any, main: MainProcess, clock: FakeClock, refusals: list[Decision]
) -> None:
    # Before: Celery counted the accepted job under its name (TypeError: unhashable, in
    # the main process, after the pool process had it)
    deadline = {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=20))}
    delivery = main.deliver(celery_headers(app, task.name, "m-1", shadow=[1], **deadline))
    assert_refused_as_invalid(main, delivery, refusals, "shadow")
    assert stored_refusal(app, "m-1").reason == "invalid_message"


def test_stamps_celerys_revocation_check_cannot_read_are_refused(
    app: Celery, task: Any, main: MainProcess, clock: FakeClock, refusals: list[Decision]
) -> None:
    # Before: Celery's revocation check iterated them when the message was handed to
    # the pool (TypeError, in the main process)
    deadline = {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=20))}
    headers = celery_headers(app, task.name, "m-1", stamped_headers=5, **deadline)
    delivery = main.deliver(headers)
    assert_refused_as_invalid(main, delivery, refusals, "stamped_headers")
    assert stored_refusal(app, "m-1").reason == "invalid_message"


@settings(
    max_examples=200, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    task_id=st.one_of(st.uuids().map(str), st.text(max_size=300), st.integers(), st.none()),
    shadow=st.one_of(st.none(), st.text(max_size=20), st.integers(), st.lists(st.none())),
    retries=st.one_of(st.none(), st.integers(-2, 2**31 + 1), st.text(max_size=3), st.floats()),
)
def test_the_check_every_message_meets_is_the_envelopes_rule(
    app: Celery,
    task: Any,
    main: MainProcess,
    clock: FakeClock,
    refusals: list[Decision],
    task_id: object,
    shadow: object,
    retries: object,
) -> None:
    # DeadlineRequest.revoked() holds envelope.fits inline: the two say the same
    from celery_deadlines.rules import envelope

    refusals.clear()
    headers = celery_headers(app, task.name, "m-1", id=task_id, shadow=shadow, retries=retries)
    main.deliver(headers)
    refused = [decision.reason for decision in refusals] == ["invalid_message"]
    assert refused is not envelope.fits(task_id, shadow or task.name, retries)


def test_a_values_long_repr_is_cut_in_the_refusal(
    app: Celery, task: Any, main: MainProcess, clock: FakeClock, refusals: list[Decision]
) -> None:
    main.deliver(headers(app, task, clock, timelimit=["x" * 100_000, None]))
    [decision] = refusals
    assert "timelimit ['xxx" in decision.detail
    assert len(decision.detail) < 300


def test_a_refusal_is_named_by_the_registered_task_not_by_the_messages_shadow(
    app: Celery, task: Any, main: MainProcess, clock: FakeClock
) -> None:
    # the metrics count refusals by this name: a shadow is whatever its producer wrote
    from celery_deadlines import deadline_refused

    names: list[str] = []

    def record(task_name: str, **_: Any) -> None:
        names.append(task_name)

    deadline_refused.connect(record, weak=False)
    try:
        main.deliver(headers(app, task, clock, shadow="shown-as-anything"))
    finally:
        deadline_refused.disconnect(record)
    assert names == [task.name]
    assert stored_refusal(app, "m-1").reason == "deadline_passed"


def test_a_refusal_whose_result_cannot_be_stored_is_logged_and_still_acknowledged(
    app: Celery,
    task: Any,
    main: MainProcess,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(app.backend, "mark_as_failure", Mock(side_effect=OSError("away")))
    with caplog.at_level(logging.WARNING, logger="celery_deadlines"):
        delivery = main.deliver(headers(app, task, clock))
    assert delivery.acks == 1
    [error] = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert "storing its refusal failed" in error.getMessage()


# -- with the run ledger --------------------------------------------------------------------


@pytest.fixture
def fake_ledger(app: Celery) -> Iterator[FakeLedger]:
    app.conf.deadlines_ledger = True
    with use_ledger(FakeLedger()) as fake:
        yield fake


def test_with_the_ledger_a_malformed_message_ends_the_run_its_id_and_retries_name(
    app: Celery, task: Any, main: MainProcess, clock: FakeClock, fake_ledger: FakeLedger
) -> None:
    main.deliver(celery_headers(app, task.name, "m-1", timelimit=["x", "y"]))
    run = fake_ledger.runs["m-1"]
    assert (run.status, run.reason) == ("EXPIRED", "invalid_message")
    assert stored_refusal(app, "m-1").reason == "invalid_message"


def test_with_the_ledger_a_message_whose_retries_name_no_attempt_changes_no_run(
    app: Celery,
    task: Any,
    main: MainProcess,
    clock: FakeClock,
    fake_ledger: FakeLedger,
    refusals: list[Decision],
    stored: list[object],
) -> None:
    # Before: the pool process's claim read int("x") (ValueError) or, on PostgreSQL, a
    # retries beyond its integer (DataError): the delivery failed with a raw error
    delivery = main.deliver(celery_headers(app, task.name, "m-1", retries="x"))
    decision = assert_refused_as_invalid(main, delivery, refusals, "retries")
    assert "nothing is stored" in decision.detail
    assert fake_ledger.runs == {}
    assert stored == []
