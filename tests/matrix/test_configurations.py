"""The configuration matrix: one scenario on a real worker in each configuration real
projects run (tests/matrix/rows.py), judged from the outside: the caller's
``AsyncResult``, the ledger's rows, ``manage.py deadlines explain``, the provider's calls
and the bodies' notes. Every row's scenario runs once, side by side with the others',
before the first test (conftest.py's ``observations``); each test below checks one
promise of it, and a failed one shows what every probe's caller and the ledger saw and
the row's worker's log. The pools' and configurations' enforcement table
(docs/explanation/pools.md) is read and each row's claims checked against what its worker
did.

Opt-in (``make matrix-configs``, which also runs the Celery 5.5 and 5.6 rows in their
environments): skipped unless ``DEADLINES_MATRIX=1``.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pytest

from tests.support import isolation

from . import table
from .conftest import Observe, rows_here
from .orders.views import ORDER_BUDGET
from .rows import CONFIGURATIONS, ROWS, Row
from .scenario import Observed, Probe

pytestmark = pytest.mark.skipif(
    os.environ.get("DEADLINES_MATRIX") != "1",
    reason="opt-in: make matrix-configs (the configuration matrix, real workers)",
)


def _eager(row: Row) -> bool:
    return row.settings_module == "local"


def cases(probe: str, *, eager: bool = True) -> list[Any]:
    """The rows of this Celery release that run ``probe`` (the eager row's too unless
    ``eager`` is False), once per serializer, each marked with the probe it checks."""
    return [
        pytest.param(row, serializer, id=f"{row.name}-{serializer}", marks=pytest.mark.probe(probe))
        for row in rows_here()
        if probe in row.probes and (eager or not _eager(row))
        for serializer in row.serializers
    ]


#: What a refusal of an effect or a call raises in the body (not a configuration error).
REFUSALS = {"DispatchRefused", "DeadlineRefused", "StaleLease"}


def _probe(observed: Observed, name: str) -> Probe:
    return observed.probes[name]


def _told(probe: Probe) -> str:
    """What the caller was told, for an assertion's message."""
    return f"{probe.state} {probe.error or probe.raised}: {probe.error_text[:300]}"


@pytest.mark.parametrize(("row", "serializer"), cases("order", eager=False))
def test_the_worker_reports_what_it_holds_and_started_on_its_queue(
    row: Row, serializer: str, observe: Observe
) -> None:
    """The enqueue gate judges a publish by the workers' reports (core/workload.py): in
    each configuration, the row's worker wrote one for its queue while it ran, and its
    counts add up."""
    observed = observe(row, serializer)
    reports = [[int(n) for n in value.split()] for value in observed.workload.values()]
    assert reports, f"no report for the queue: {observed.workload}"
    seq, held, received, started = max(reports, key=lambda counts: counts[3])
    assert seq > 0
    assert started >= 1  # the order at least
    assert received >= started + held


@pytest.mark.parametrize(("row", "serializer"), cases("order"))
def test_an_order_placed_with_a_budget_hands_its_deadline_to_its_child(
    row: Row, serializer: str, observe: Observe
) -> None:
    observed = observe(row, serializer)
    order = _probe(observed, "order")
    assert order.raised is None, _told(order)
    assert order.state == "SUCCESS", _told(order)
    child = observed.child
    assert child is not None, "the order named no child"
    if not _eager(row):  # an eager child's caller is the order's body
        assert child.state == "SUCCESS", _told(child)
    assert order.run is not None
    assert child.run is not None
    assert child.run["status"] == "SUCCEEDED", _told(child)
    enqueued = order.events[0]
    assert enqueued["kind"] == "enqueue"
    # the view's budget, from the request: the order's deadline, and its child's the same
    assert order.run["deadline"] - enqueued["at"] <= timedelta(seconds=ORDER_BUDGET)
    assert child.run["deadline"] == order.run["deadline"]


@pytest.mark.parametrize(("row", "serializer"), cases("order"))
def test_the_claim_gives_one_attempt_the_run_and_the_ledger_records_it(
    row: Row, serializer: str, observe: Observe
) -> None:
    order = _probe(observe(row, serializer), "order")
    assert order.run is not None
    assert (order.run["status"], order.run["attempt"]) == ("SUCCEEDED", 1)
    if not _eager(row):  # an eager run is claimed by the caller's process
        assert order.run["owner"].startswith(isolation.queue_name("matrix-"))
    assert [(e["kind"], e["outcome"]) for e in order.events] == [
        ("enqueue", "applied"),
        ("claim", "applied"),
        ("succeeded", "applied"),
    ]


@pytest.mark.parametrize(("row", "serializer"), cases("order"))
def test_the_childs_effect_is_performed_once(row: Row, serializer: str, observe: Observe) -> None:
    observed = observe(row, serializer)
    order = _probe(observed, "order")
    assert order.raised is None, _told(order)
    assert [c["outcome"] for c in order.calls] == ["accepted"]
    assert observed.child is not None
    assert [(e["state"], e["dispatches"]) for e in observed.child.effects] == [("SUCCEEDED", 1)]


@pytest.mark.parametrize(("row", "serializer"), cases("refusal"))
def test_a_message_left_in_the_queue_past_its_deadline_is_refused_and_its_caller_told(
    row: Row, serializer: str, observe: Observe
) -> None:
    refusal = _probe(observe(row, serializer), "refusal")
    if _eager(row):  # no queue: its deadline passed before the call, which raises
        assert refusal.raised == "DeadlineRefused", _told(refusal)
        assert "deadline_passed" in refusal.error_text
        return
    assert (refusal.state, refusal.error) == ("FAILURE", "DeadlineRefused"), _told(refusal)
    assert "deadline_passed" in refusal.error_text
    assert refusal.run is not None
    assert (refusal.run["status"], refusal.run["reason"]) == ("EXPIRED", "deadline_passed")
    assert refusal.calls == []


#: The content type each serializer gives a message (kombu's names).
CONTENT_TYPES = {
    "json": "application/json",
    "msgpack": "application/x-msgpack",
    "pickle": "application/x-python-serialize",
}


@pytest.mark.parametrize(
    ("row", "serializer"),
    [case for case in cases("refusal", eager=False) if case.values[0].broker == "redis"],
)
def test_the_callers_messages_are_encoded_with_the_rows_serializer(
    row: Row, serializer: str, observe: Observe
) -> None:
    # read while the message waits in its Redis queue, before any worker consumes it
    refusal = _probe(observe(row, serializer), "refusal")
    assert refusal.content_type == CONTENT_TYPES[serializer]


@pytest.mark.parametrize(("row", "serializer"), cases("retry-refused"))
def test_a_retry_the_deadline_cannot_hold_is_refused_and_its_caller_told(
    row: Row, serializer: str, observe: Observe
) -> None:
    retry = _probe(observe(row, serializer), "retry-refused")
    told = retry.raised if _eager(row) else retry.error
    assert told == "DeadlineRefused", _told(retry)
    assert "retry_budget_exhausted" in retry.error_text
    assert len(retry.noted("attempt")) == 1
    if not _eager(row):
        assert retry.state == "FAILURE"
    assert retry.run is not None
    assert retry.run["status"] == "EXPIRED"
    assert retry.run["reason"] == "retry_budget_exhausted"


@pytest.mark.parametrize(("row", "serializer"), cases("max-retries"))
def test_celerys_own_max_retries_ends_the_retries_before_the_deadline(
    row: Row, serializer: str, observe: Observe
) -> None:
    retries = _probe(observe(row, serializer), "max-retries")
    # Celery's default max_retries is 3: four attempts, then the task's own error
    assert len(retries.noted("attempt")) == 4, _told(retries)
    assert (retries.state, retries.error) == ("FAILURE", "RuntimeError"), _told(retries)
    assert retries.run is not None
    assert retries.run["status"] == "FAILED"


@pytest.mark.parametrize(("row", "serializer"), cases("own-limit"))
def test_the_projects_own_time_limits_are_kept_under_a_longer_deadline(
    row: Row, serializer: str, observe: Observe
) -> None:
    limited = _probe(observe(row, serializer), "own-limit")
    # the project's soft limit (3 s) then its hard one (6 s), long before the 15 s deadline
    assert limited.noted("soft"), "the project's soft time limit did not come"
    assert not limited.noted("end"), "the body outlived the project's hard time limit"
    assert (limited.state, limited.error) == ("FAILURE", "TimeLimitExceeded"), _told(limited)
    assert limited.run is not None
    assert (limited.run["status"], limited.run["reason"]) == ("FAILED", "time_limit")


@pytest.mark.parametrize(("row", "serializer"), cases("order"))
def test_explain_tells_the_operator_who_ran_the_order_and_how_it_ended(
    row: Row, serializer: str, observe: Observe
) -> None:
    observed = observe(row, serializer)
    order = _probe(observed, "order")
    assert order.task_id is not None
    assert order.run is not None
    text = observed.explain
    assert f"run {order.task_id} (orders.place)" in text, text
    assert "SUCCEEDED" in text.splitlines()[1], text
    assert f"last claimed by {order.run['owner']}" in text, text
    assert "1 child run(s)" in text, text


def _table_row(row: Row) -> str:
    return "task_always_eager" if _eager(row) else row.pool


@pytest.mark.parametrize(("row", "serializer"), cases("overrun"))
def test_the_enforcement_tables_row_is_what_the_worker_did_past_the_deadline(
    row: Row, serializer: str, observe: Observe
) -> None:
    claims = table.rows()[_table_row(row)]
    over = _probe(observe(row, serializer), "overrun")
    assert over.noted("start"), f"the overrun probe never started: {_told(over)}"
    seen: dict[str, str] = {}
    seen["body"] = "runs on" if over.noted("past") else "stopped"
    seen["soft"] = "yes" if over.noted("soft") else "no"
    run = over.run
    seen["end"] = (
        "none"
        if run is None
        else "expired"
        if (run["status"], run["reason"]) == ("EXPIRED", "deadline_passed")
        else "running"
        if run["status"] == "RUNNING"
        else f"{run['status']} {run['reason']}"
    )
    late = over.noted("past")
    if not late:
        seen["late_writes"] = "none"
    elif run is None:
        seen["late_writes"] = "unfenced"
    else:
        refused = [e for e in over.events if e["outcome"] == "rejected"]
        seen["late_writes"] = "fenced" if refused else "unfenced"
    effect = over.noted("effect-raised")
    effect_calls = [c for c in over.calls if c["key"] == f"{over.key}-effect"]
    if not late:
        seen["effect"] = "unreached" if not effect_calls else "performed"
    elif effect and effect[0]["error"] in REFUSALS and not effect_calls:
        seen["effect"] = "refused"
    else:
        seen["effect"] = f"performed or other: {effect or over.noted('effect-performed')}"
    call = over.noted("call-raised")
    call_calls = [c for c in over.calls if c["key"] == f"{over.key}-call"]
    if not late:
        seen["call"] = "unreached" if not call_calls else "sent"
    elif call and call[0]["error"] == "DeadlineRefused" and not call_calls:
        seen["call"] = "refused"
    else:
        seen["call"] = f"sent or other: {call or over.noted('call-sent')}"
    seen["remaining"] = (
        "unread" if not late else "negative" if late[0]["remaining"] < 0 else "not negative"
    )
    seen["caller"] = (
        over.state if over.state in ("SUCCESS", "IGNORED") else str(over.error or over.raised)
    )
    claimed = {column: claims[column] for column in seen}
    assert seen == claimed, f"the table's row {claims['name']!r} says otherwise: {_told(over)}"
    ended = next((e["at"] for e in over.events if e["status"] == "EXPIRED"), None)
    if ended is not None and late and _eager(row):
        # no sweeper where no worker runs: the caller's process ends the run once the
        # body has ended, after its late writes
        assert ended.timestamp() > late[-1]["t"]
    elif ended is not None and late:
        # a worker's sweeper ended the run before the late attempt's first write after it
        assert ended.timestamp() < late[0]["t"]


@pytest.mark.parametrize(
    ("row", "serializer"), [case for case in cases("overrun") if _eager(case.values[0])]
)
def test_an_eager_run_past_its_deadline_ends_expired_and_its_caller_is_told(
    row: Row, serializer: str, observe: Observe
) -> None:
    # nothing stops an eager body: it runs on past its deadline, in the caller's process
    over = _probe(observe(row, serializer), "overrun")
    assert over.noted("past"), _told(over)
    assert over.run is not None
    assert (over.run["status"], over.run["reason"]) == ("EXPIRED", "deadline_passed"), _told(over)
    assert (over.raised or over.error) == "DeadlineRefused", _told(over)


def test_every_configuration_of_the_issue_has_a_row() -> None:
    covered = {name for row in ROWS for name in row.covers}
    assert covered == set(CONFIGURATIONS)


def test_the_enforcement_table_has_a_row_for_every_pool_and_only_rows_the_matrix_checks() -> None:
    checked = {_table_row(row) for row in ROWS if "overrun" in row.probes}
    assert set(table.rows()) == checked == {
        "prefork", "gevent", "eventlet", "threads", "solo", "task_always_eager",
    }  # fmt: skip
