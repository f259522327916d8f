"""The enqueue gate's rule for the queue ahead (rules/backlog.py): what the samples of a
queue show, and which publishes it refuses, with the arithmetic."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from hypothesis import given
from hypothesis import strategies as st
from kombu import Connection

from celery_deadlines import DEADLINE_HEADER, Gate, Reason, clock
from celery_deadlines.core import backlog
from celery_deadlines.rules.backlog import (
    MEMORY,
    MOST_REPORTS,
    OVERLOAD,
    SHED,
    STALE,
    Backlog,
    Best,
    Reports,
    Sample,
    admit,
    at_best,
    estimate,
    read_reports,
    remember,
)
from tests.support.unit_tasks import make_task

NOW = datetime(2026, 12, 5, 8, 0, tzinfo=UTC)
BUDGET = timedelta(seconds=1)
RESERVE = timedelta(milliseconds=60)


def served(
    depth: int, taken: int, pushed: int, readings: int = 21, every: float = 0.0625
) -> list[Sample]:
    """A queue read every ``every`` s: ``taken`` and ``pushed`` per reading, ``depth``
    waiting at the last one; the publisher refused nothing."""
    return [
        Sample(
            i * every, depth - (readings - 1 - i) * (pushed - taken), taken, pushed, i * pushed, 0
        )
        for i in range(readings)
    ]


def test_the_rate_is_what_was_taken_off_while_the_queue_waited() -> None:
    samples = served(depth=100, taken=5, pushed=5)
    backlog = estimate(samples, samples[-1].at)
    assert backlog == Backlog(depth=100, rate=80.0, offered=80.0, span=1.0)
    assert backlog.wait == 1.25


def test_a_publish_its_queue_cannot_reach_before_its_last_start_is_refused_with_arithmetic() -> (
    None
):
    backlog = Backlog(depth=100, rate=80.0, offered=80.0, span=1.0)
    decision = admit(backlog, NOW + BUDGET, NOW, RESERVE)
    assert decision is not None
    assert (decision.gate, decision.reason) == (Gate.ENQUEUE, Reason.QUEUE_BACKLOG)
    assert decision.deadline == NOW + BUDGET  # the deadline judged, never moved
    assert decision.detail == (
        "100 messages ahead in its queue, taken off at 80.0/s (measured over 1.00 s): a "
        "wait of 1.250 s, more than the 0.940 s left before its last start (the deadline "
        "less the reserve of 0.060 s)"
    )
    refusal = decision.refusal()
    assert refusal.reason == "queue_backlog"
    assert refusal.gate == "enqueue"


def test_a_queue_that_reaches_a_publish_in_time_admits_it_when_it_is_not_overloaded() -> None:
    backlog = Backlog(depth=70, rate=80.0, offered=80.0 * OVERLOAD, span=1.0)
    assert backlog.wait < 0.94
    assert admit(backlog, NOW + BUDGET, NOW, RESERVE) is None


def test_under_overload_a_publish_that_would_wait_more_than_a_share_of_its_budget_is_refused() -> (
    None
):
    waits = 80.0 * SHED
    backlog = Backlog(depth=int(waits) + 1, rate=80.0, offered=160.0, span=1.0)
    decision = admit(backlog, NOW + BUDGET, NOW, RESERVE)
    assert decision is not None
    assert decision.reason is Reason.QUEUE_BACKLOG
    assert "while 160.0/s were offered: more than 1.5 x what is served" in decision.detail
    shorter = backlog._replace(depth=int(waits) - 1)
    assert admit(shorter, NOW + BUDGET, NOW, RESERVE) is None


def test_overload_is_judged_only_over_most_of_a_second() -> None:
    brief = Backlog(depth=20, rate=80.0, offered=400.0, span=0.3)
    assert not brief.overloaded
    assert admit(brief, NOW + BUDGET, NOW, RESERVE) is None


def test_the_publisher_s_own_refusals_count_in_what_was_offered() -> None:
    samples = served(depth=10, taken=5, pushed=5)
    # it tried three times what it published: two thirds refused
    samples = [s._replace(tried=3 * s.tried, refused=2 * s.tried) for s in samples]
    backlog = estimate(samples, samples[-1].at)
    assert backlog is not None
    assert round(backlog.offered) == 240


def test_no_estimate_without_evidence() -> None:
    samples = served(depth=100, taken=5, pushed=5)
    last = samples[-1].at
    assert estimate(samples[:1], last) is None  # one reading: nothing measured
    assert estimate(samples, last + STALE + 0.01) is None  # stale
    thin = samples[:4]
    assert estimate(thin, thin[-1].at) is None  # 0.19 s measured: too thin
    nothing_taken = [s._replace(taken=0) for s in samples]
    assert estimate(nothing_taken, last) is None  # no worker serves it: the claim gate judges
    emptied = [*samples[:-1], samples[-1]._replace(depth=0)]
    assert estimate(emptied, last) is None  # nothing waits now


def test_a_moment_the_queue_emptied_is_left_out_of_the_rate() -> None:
    samples = served(depth=100, taken=5, pushed=5, readings=41)
    # between readings 20 and 21 the queue emptied (the newest message last seen was
    # taken): that interval says only that the workers kept up
    samples[21] = samples[21]._replace(taken=None, pushed=None)
    backlog = estimate(samples, samples[-1].at)
    assert backlog is not None
    assert backlog.rate == 80.0


@given(
    depth=st.integers(1, 10_000),
    rate=st.floats(0.01, 1e6, allow_nan=False),
    offered=st.floats(0, 1e7, allow_nan=False),
    span=st.floats(0, 2),
    budget=st.floats(0.001, 3600),
)
def test_a_publish_is_refused_only_past_its_last_start_or_past_a_share_under_overload(
    depth: int, rate: float, offered: float, span: float, budget: float
) -> None:
    backlog = Backlog(depth, rate, offered, span)
    deadline = NOW + timedelta(seconds=budget)
    decision = admit(backlog, deadline, NOW, RESERVE)
    left = (deadline - RESERVE - NOW).total_seconds()
    if backlog.wait <= min(left, SHED * budget) or (
        not backlog.overloaded and backlog.wait <= left
    ):
        assert decision is None
    else:
        assert decision is not None
        assert decision.deadline == deadline
        figures = re.match(r"(\d+) messages ahead", decision.detail)
        assert figures is not None
        assert int(figures[1]) == depth


@given(
    st.lists(
        st.tuples(
            st.floats(0.001, 0.5),
            st.integers(0, 10_000),
            st.one_of(st.none(), st.integers(-1000, 1000)),
            st.one_of(st.none(), st.integers(-1000, 1000)),
            st.one_of(st.none(), st.tuples(*[st.integers(0, 10**15)] * 3)),
        ),
        max_size=50,
    )
)
def test_whatever_a_queue_reads_the_estimate_is_finite_or_none(
    readings: list[tuple[float, int, int | None, int | None, tuple[int, int, int] | None]],
) -> None:
    at, samples = 0.0, []
    for step, depth, taken, pushed, reports in readings:
        at += step
        sample = Sample(at, depth, taken, pushed, 0, 0)
        if reports is not None:
            sample = sample._replace(held=reports[0], received=reports[1], started=reports[2])
        samples.append(sample)
    backlog = estimate(samples, at)
    if backlog is not None:
        assert backlog.rate > 0
        assert backlog.depth > 0
        assert backlog.span > 0
        assert backlog.wait >= 0


# -- the workers' reports (core/workload.py): what they hold, received and started -------


def with_reports(samples: list[Sample], held: int, received: int, started: int) -> list[Sample]:
    """The same readings with the workers reporting ``held`` at each, and ``received``
    and ``started`` between each two."""
    return [s._replace(held=held, received=received, started=started) for s in samples]


def test_with_reports_a_message_waits_behind_the_queue_and_what_the_workers_hold() -> None:
    samples = with_reports(served(depth=40, taken=5, pushed=5), held=16, received=5, started=5)
    backlog = estimate(samples, samples[-1].at)
    assert backlog == Backlog(depth=56, rate=80.0, offered=80.0, span=1.0, held=16)
    decision = admit(backlog._replace(depth=90), NOW + BUDGET, NOW, RESERVE)
    assert decision is not None
    assert decision.detail.startswith(
        "90 messages ahead (74 in its queue, 16 held by its workers), started at 80.0/s "
        "(measured over 1.00 s): a wait of 1.125 s"
    )


def test_a_message_the_claim_gate_refused_was_taken_off_but_is_not_counted_as_service() -> None:
    # the broker saw 5 taken off each reading; the workers started 2 and refused 3
    samples = with_reports(served(depth=40, taken=5, pushed=5), held=16, received=5, started=2)
    backlog = estimate(samples, samples[-1].at)
    assert backlog is not None
    assert backlog.rate == 32.0
    assert backlog.offered == 80.0


def test_work_the_workers_hold_is_judged_where_the_broker_shows_an_empty_queue() -> None:
    # the workers prefetch everything: the list is empty, its pushes and takes unknown
    samples = [
        Sample(i * 0.0625, 0, None, None, 0, 0, held=12, received=10, started=5) for i in range(21)
    ]
    backlog = estimate(samples, samples[-1].at)
    assert backlog == Backlog(depth=12, rate=80.0, offered=160.0, span=1.0, held=12)
    assert backlog.overloaded


def test_a_moment_nothing_waited_is_left_out_of_the_reported_rate() -> None:
    samples = with_reports(served(depth=40, taken=5, pushed=5), held=4, received=5, started=5)
    # at reading 10 nothing waited: the workers may have waited for work around it
    samples[10] = samples[10]._replace(depth=0, held=0, started=1)
    samples[11] = samples[11]._replace(started=1)
    backlog = estimate(samples, samples[-1].at)
    assert backlog is not None
    assert backlog.rate == 80.0


def test_reports_that_miss_a_consumer_of_the_queue_are_not_judged_by() -> None:
    # the broker saw 5 taken off each reading, the reporting workers received 2:
    # another consumer, which does not report, took the rest
    samples = with_reports(served(depth=40, taken=5, pushed=5), held=16, received=2, started=2)
    backlog = estimate(samples, samples[-1].at)
    assert backlog == Backlog(depth=40, rate=80.0, offered=80.0, span=1.0)


def test_a_report_counts_once_its_sequence_grows_and_until_it_stops_growing() -> None:
    worker = b"celery@a:1"
    reports, seen = read_reports({worker: b"1 6 10 4"}, {}, now=0.0)
    assert reports is None  # seen once: a report of a worker perhaps gone
    reports, seen = read_reports({worker: b"2 5 13 6"}, seen, now=0.1)
    assert reports == Reports(held=5, received=3, started=2)
    reports, seen = read_reports({worker: b"2 5 13 6"}, seen, now=0.1 + STALE)
    assert reports == Reports(held=5, received=0, started=0)
    reports, seen = read_reports({worker: b"2 5 13 6"}, seen, now=0.11 + STALE)
    assert reports is None  # it stopped reporting: stopped, or gone


def test_a_worker_started_again_under_its_name_counts_from_its_new_counts() -> None:
    worker = b"celery@a:1"
    _, seen = read_reports({worker: b"7 6 100 90"}, {}, now=0.0)
    reports, seen = read_reports({worker: b"1 2 3 1"}, seen, now=0.1)
    assert reports is None  # its counts fell: a new worker, seen once
    reports, seen = read_reports({worker: b"2 2 5 2"}, seen, now=0.2)
    assert reports == Reports(held=2, received=2, started=1)


@pytest.mark.parametrize(
    "value",
    [
        b"2 5 13",
        b"2 5 13 6 1",
        b"-2 5 13 6",
        b"2 5 x 6",
        b"2 5 13 1234567890123456",
        b"2 8 13 6",  # holds more than it received and did not start
        "2 5 13 6",
        7,
    ],
)
def test_a_report_that_is_not_four_counts_is_not_read(value: Any) -> None:
    worker, other = b"celery@a:1", b"celery@b:1"
    _, seen = read_reports({worker: b"1 1 2 1", other: b"1 1 2 1"}, {}, now=0.0)
    reports, _ = read_reports({worker: value, other: b"2 1 3 2"}, seen, now=0.1)
    assert reports == Reports(held=1, received=1, started=1)


def test_a_queue_with_more_reports_than_workers_run_is_not_judged_by_them() -> None:
    raw = {f"celery@{i}:1".encode(): b"1 1 1 1" for i in range(MOST_REPORTS + 1)}
    assert read_reports(raw, {}, now=0.0) == (None, {})


# -- the reading (core/backlog.py): what it never does to a publish ----------------------


def deadline_task(app: Celery) -> Any:
    return make_task(app, "unit.backlog", budget=1, reserve=0.06)


def stamped(queue: str = "q", **options: Any) -> dict[str, Any]:
    return {"queue": queue, "headers": {DEADLINE_HEADER: time.time() + 1.0}, **options}


def test_a_reading_that_fails_never_fails_the_publish_nor_refuses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = Celery("backlog-broken", broker="memory://", set_as_current=False)
    task = deadline_task(app)

    def unreachable(*_: Any, **__: Any) -> Any:
        raise ConnectionError("broker down")

    monkeypatch.setattr(app, "producer_or_acquire", unreachable)
    assert backlog.admit(task, stamped()) is None
    watch = vars(app)["_celery_deadlines_backlog"]["q"]
    assert (watch.samples, watch.judged) == ([], None)


def test_a_reading_never_connects_to_the_broker_the_publish_connects_under_its_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker that is down fails the publish after Celery's retry policy; a reading
    that connected first would add kombu's connection retries (seconds) to every one."""
    app = Celery("backlog-down", broker="redis://127.0.0.1:1/0", set_as_current=False)
    task = deadline_task(app)
    connecting: list[object] = []
    monkeypatch.setattr(Connection, "_ensure_connection", lambda self, **_: connecting.append(self))
    assert backlog.admit(task, stamped()) is None
    assert connecting == []


def test_a_transport_it_does_not_read_is_asked_again_only_after_a_while() -> None:
    app = Celery("backlog-memory", broker="memory://", set_as_current=False)
    task = deadline_task(app)
    assert backlog.admit(task, stamped()) is None
    watch = vars(app)["_celery_deadlines_backlog"]["q"]
    assert watch.read_at - clock.monotonic() > backlog.UNREAD - 1


def test_a_publish_that_starts_later_is_one_of_many_or_goes_by_routes_is_not_judged() -> None:
    app = Celery("backlog-later", broker="memory://", set_as_current=False)
    task = deadline_task(app)
    assert backlog.admit(task, stamped(countdown=5)) is None
    assert backlog.admit(task, stamped(eta=datetime.now(UTC))) is None
    assert backlog.admit(task, stamped(group_id="g-1")) is None  # the rest would be published
    assert backlog.admit(task, stamped(chord={"task": "unit.body"})) is None
    assert getattr(app, "_celery_deadlines_backlog", {}) == {}


def route_by_argument(name: str, args: Any, kwargs: Any, options: Any, **_: Any) -> Any:
    return {"queue": "big" if args and args[0] > 100 else "small"}


@pytest.mark.parametrize(
    ("routes", "judged_on"),
    [
        ({"unit.*": {"queue": "elsewhere"}}, "elsewhere"),  # by the name alone
        ([{"unit.backlog": "named"}], "named"),
        ({"other.*": {"queue": "elsewhere"}}, "celery"),  # no route: the default queue
        ([route_by_argument], None),  # may read the arguments: not worked out
    ],
)
def test_a_queue_chosen_by_the_apps_routes_is_judged_when_the_name_alone_chooses_it(
    routes: Any, judged_on: str | None
) -> None:
    app = Celery("backlog-routes", broker="memory://", set_as_current=False)
    app.conf.task_routes = routes
    task = deadline_task(app)
    assert backlog.admit(task, {"headers": {DEADLINE_HEADER: time.time() + 1}}) is None
    watched = list(getattr(app, "_celery_deadlines_backlog", {}))
    assert watched == ([] if judged_on is None else [judged_on])


def test_an_eager_publish_reads_no_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """``task_always_eager`` (a project's local settings) runs the task in the call: no
    queue is ahead of it, and a broker that is not there is never asked."""
    app = Celery("backlog-eager", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.update(task_always_eager=True, deadlines_ledger=False)
    task = deadline_task(app)
    asked: list[float] = []
    monkeypatch.setattr(backlog._Watch, "read", lambda _, __, now: asked.append(now))
    assert backlog.admit(task, stamped()) is None
    assert 0 < task.apply_async(queue="q").get() <= 1  # its remaining(): it ran
    assert asked == []


# -- the best rate within MEMORY --------------------------------------------------------


def test_a_queue_is_judged_at_the_best_rate_measured_lately_not_at_a_slow_moment() -> None:
    """A worker paused for a while serves at its rate again once it is back: a moment's
    slower rate does not refuse what would then start in time."""
    fast = Backlog(depth=40, rate=80.0, offered=80.0, span=1.0)
    best = remember(None, fast, now=10.0)
    slow = Backlog(depth=60, rate=10.0, offered=80.0, span=1.0)  # 6 s behind at 10/s
    best = remember(best, slow, now=12.0)
    judged = at_best(slow, best)
    assert judged == Backlog(depth=60, rate=80.0, offered=80.0, span=1.0, measured=10.0)
    assert admit(judged, NOW + BUDGET, NOW, RESERVE) is None  # 0.75 s behind at 80/s
    refused = admit(at_best(slow._replace(depth=100), best), NOW + BUDGET, NOW, RESERVE)
    assert refused is not None
    assert refused.detail.startswith(
        "100 messages ahead in its queue, taken off at 80.0/s (its best within 30 s; "
        "10.0/s over the last 1.00 s): a wait of 1.250 s"
    )


def test_the_best_rate_is_forgotten_after_memory_and_a_better_one_replaces_it() -> None:
    best = remember(None, Backlog(10, 80.0, 80.0, 1.0), now=0.0)
    assert best == Best(80.0, 0.0)
    assert remember(best, None, now=MEMORY) == best  # nothing measured: kept
    assert remember(best, None, now=MEMORY + 0.1) is None
    later = remember(best, Backlog(10, 50.0, 80.0, 1.0), now=MEMORY + 1)
    assert later == Best(50.0, MEMORY + 1)  # the old best forgotten: what is measured now
    assert remember(later, Backlog(10, 90.0, 90.0, 1.0), now=MEMORY + 2) == Best(90.0, MEMORY + 2)
    assert at_best(None, later) is None
    faster = Backlog(10, 120.0, 80.0, 1.0)
    assert at_best(faster, later) is faster  # a better rate now is judged as measured
