"""A job's time limits: what Celery would apply without the library (the message's, the
task's, the app's, the worker's), capped by the deadline, and the record its claim keeps
(celery_deadlines.rules.limits, celery_deadlines.timelimits, DeadlineRequest.time_limits).
Fake clock, Celery's own request and task binding; the real workers' tests are
tests/integration/core/test_timelimits.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, Task
from celery.app.task import Context
from hypothesis import given as given_examples
from hypothesis import strategies as st

from celery_deadlines import DEADLINE_HEADER, DeadlineTask
from celery_deadlines.core import timelimits
from celery_deadlines.core.timelimits import HANDED, record_worker_limits
from celery_deadlines.rules import limits
from celery_deadlines.rules.gates import MIN_TIME_LIMIT
from celery_deadlines.rules.limits import APP, DEADLINE, MESSAGE, TASK, WORKER, Given
from celery_deadlines.rules.wire import encode
from celery_deadlines.testing import FakeClock
from tests.support.unit_tasks import claim, make_task


def worker(app: Celery, time_limit: float | None, soft_time_limit: float | None) -> None:
    """What ``worker_init`` tells: the WorkController's own limits (Celery's ``either``:
    the command line's, else the app's settings)."""
    record_worker_limits(
        SimpleNamespace(app=app, time_limit=time_limit, soft_time_limit=soft_time_limit)
    )


def handed(request: Any) -> limits.AttemptLimits | None:
    """What the job was given, as its pool process reads it from the request the main
    process handed it (Celery's Context of it, as the tracer makes it)."""
    context = Context(request._request_dict)
    assert HANDED not in (context.headers or {})  # never a header of the caller's
    return timelimits.handed(context, request._task)


@pytest.fixture
def cookiecutter() -> Iterator[Celery]:
    """An app with cookiecutter-django's app-wide limits in its settings."""
    app = Celery("cookiecutter", broker="memory://", backend="cache+memory://")
    app.conf.update(task_time_limit=300, task_soft_time_limit=60, deadlines_ledger=False)
    yield app
    app.close()


def approx(seconds: float) -> float:
    """``seconds``, to the microsecond (typed as the value it stands for)."""
    close: Any = pytest.approx(seconds)
    return close  # type: ignore[no-any-return]


def nothing() -> None:
    return None


# -- what Celery would apply, capped by the deadline (the worker's main process) ------------


def test_the_workers_limits_from_its_command_line_are_capped_not_replaced(
    app: Celery, clock: FakeClock
) -> None:
    worker(app, 6.0, 3.0)  # celery worker --time-limit 6 --soft-time-limit 3
    task = make_task(app)
    request, _ = claim(app, task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=30))})
    assert request.time_limits == (6.0, 3.0)
    assert handed(request) == limits.AttemptLimits(Given(6.0, WORKER), Given(3.0, WORKER))
    assert not request._capped_by_deadline  # a kill at 6 s is the worker's limit: FAILED


def test_the_workers_limits_are_shortened_by_a_deadline_that_leaves_less(
    app: Celery, clock: FakeClock
) -> None:
    app.conf.task_time_limit = 6.0  # the app's setting; the soft limit the command line's
    worker(app, 6.0, 3.0)
    task = make_task(app)
    request, _ = claim(app, task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=4))})
    assert request.time_limits == pytest.approx((4.0, 2.0))  # the soft keeps its place
    assert handed(request) == limits.AttemptLimits(
        Given(approx(4.0), DEADLINE, 6.0, APP),
        Given(approx(2.0), DEADLINE, 3.0, WORKER),
    )
    assert request._capped_by_deadline


def test_a_task_that_declares_none_gets_the_deadline_alone_where_the_worker_has_none(
    app: Celery, clock: FakeClock
) -> None:
    worker(app, None, None)
    request, _ = claim(
        app, make_task(app), {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=30))}
    )
    assert request.time_limits == pytest.approx((30.0, None))
    assert handed(request) == limits.AttemptLimits(
        Given(approx(30.0), DEADLINE, None, None), limits.NO_LIMIT
    )


def test_the_messages_and_the_tasks_own_limits_come_before_the_workers(
    app: Celery, clock: FakeClock
) -> None:
    worker(app, 6.0, 3.0)
    deadline = {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=30))}
    own, _ = claim(app, make_task(app, "unit.own", time_limit=20, soft_time_limit=10), deadline)
    assert own.time_limits == (20, 10)
    assert handed(own) == limits.AttemptLimits(Given(20, TASK), Given(10, TASK))
    sent, _ = claim(app, make_task(app), {**deadline, "timelimit": (8, None)})
    assert sent.time_limits == (8, 3.0)
    assert handed(sent) == limits.AttemptLimits(Given(8, MESSAGE), Given(3.0, WORKER))


def test_a_message_without_a_deadline_is_handed_celerys_own_limits_and_says_who_set_them(
    app: Celery, clock: FakeClock
) -> None:
    worker(app, 6.0, None)
    request, _ = claim(app, make_task(app), {"timelimit": (None, 2)})
    assert request.time_limits == (None, 2)  # Celery's own, untouched: it adds the worker's
    assert handed(request) == limits.AttemptLimits(Given(6.0, WORKER), Given(2, MESSAGE))


def test_a_header_of_the_handed_records_name_is_overwritten_by_the_main_process(
    app: Celery, clock: FakeClock
) -> None:
    forged = (0.5, 0.5, 999.0, TASK, 999.0, TASK)
    in_time = encode(clock.now() + timedelta(seconds=30))
    messages: list[dict[str, Any]] = [{HANDED: forged}, {HANDED: forged, DEADLINE_HEADER: in_time}]
    for n, headers in enumerate(messages):
        request, _ = claim(app, make_task(app, f"unit.forged{n}"), headers)
        request.time_limits  # noqa: B018 - Celery reads it right before the pool gets the job
        assert request._request_dict[HANDED] != forged


def test_celery_57_copies_the_apps_limits_onto_a_task_and_they_are_the_apps(
    cookiecutter: Celery, clock: FakeClock
) -> None:
    task = make_task(cookiecutter)
    request, _ = claim(
        cookiecutter, task, {DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=30))}
    )
    request.time_limits  # noqa: B018
    # Celery 5.7: the task's copy of the setting; 5.5 and 5.6: the worker's (none here)
    said = handed(request)
    assert said is not None
    if task.time_limit is not None:
        assert said.hard == Given(approx(30.0), DEADLINE, 300, APP)
        assert said.soft == Given(approx(30.0 * 60 / 300), DEADLINE, 60, APP)


# -- the worker's own limits (worker_init) ---------------------------------------------------


@pytest.mark.parametrize(
    ("command_line", "settings", "kept"),
    [
        ((6.0, 3.0), (None, None), (6.0, WORKER, 3.0, WORKER)),
        ((None, None), (6.0, 3.0), (6.0, APP, 3.0, APP)),
        ((6.0, None), (300.0, 60.0), (6.0, WORKER, 60.0, APP)),
        ((None, None), (None, None), (None, None, None, None)),
        (("6", 0), (None, None), (None, None, None, None)),  # not durations: Celery's to judge
    ],
)
def test_the_worker_keeps_its_default_limits_and_who_set_each(
    app: Celery, command_line: tuple[Any, Any], settings: tuple[Any, Any], kept: tuple[Any, ...]
) -> None:
    app.conf.update(task_time_limit=settings[0], task_soft_time_limit=settings[1])
    # Celery's WorkController: the command line's value, else the setting's
    record_worker_limits(
        SimpleNamespace(
            app=app,
            time_limit=command_line[0] if command_line[0] is not None else settings[0],
            soft_time_limit=command_line[1] if command_line[1] is not None else settings[1],
        )
    )
    assert app._celery_deadlines_worker_limits == kept  # type: ignore[attr-defined]


# -- Celery 5.7's copy of the app's limits is not the task's own --------------------------------


def test_a_task_declaring_the_apps_value_itself_and_a_subclass_of_a_bound_task_keep_theirs(
    cookiecutter: Celery,
) -> None:
    declared = make_task(cookiecutter, "unit.same", time_limit=300)
    assert limits.own_limit(declared, "time_limit") == 300

    class Base(DeadlineTask):
        name = "unit.base"

    base = cookiecutter.register_task(Base())
    Child = type("Child", (type(base),), {"name": "unit.child"})
    child = cookiecutter.register_task(Child())
    assert limits.own_limit(child, "time_limit") is None  # the app's, inherited
    Own = type("Own", (type(base),), {"name": "unit.ownchild", "time_limit": 9})
    assert limits.own_limit(cookiecutter.register_task(Own()), "time_limit") == 9


def test_a_plain_celery_task_has_no_record_of_copies_and_its_limits_are_its_own(
    cookiecutter: Celery,
) -> None:
    plain = cookiecutter.task(base=Task, name="unit.plain", shared=False)(nothing)
    assert limits.own_limit(plain, "time_limit") == plain.time_limit


# -- the handed record and the claim's (rules/limits.py) ----------------------------------------


@pytest.mark.parametrize(
    "handed_record",
    [
        None,
        "6,3",
        (6.0, 3.0),
        (6.0, 3.0, 6.0, "the boss", 3.0, WORKER),  # no such source
        (6.0, 3.0, 6.0, DEADLINE, 3.0, WORKER),  # Celery's own is never the deadline's
        (True, None, None, None, None, None),
        (float("nan"), None, None, None, None, None),
        (1e300, None, None, None, None, None),
        (-1.0, None, None, None, None, None),
        ("6", None, None, None, None, None),
        (6.0, None, 6.0, None, None, None),  # a value with no source
    ],
)
def test_a_handed_record_that_is_not_one_the_main_process_writes_is_not_read(
    handed_record: object,
) -> None:
    assert limits.given(handed_record) is None


@pytest.mark.parametrize(
    "detail",
    [
        "retries=0",
        "retries=1; limits: hard 6 s by deadline, soft none",  # the deadline's says what it cut
        "retries=1; limits: hard 6 s by worker (app: 9 s), soft none",  # only the deadline's does
        "retries=1; limits: hard 6 s by boss, soft none",
        "retries=1; limits: hard 6 s by worker",
        "retries=1; limits: hard 6 s by worker, soft none; and more",
        "stale_message:w1:42",
        "",
    ],
)
def test_a_claim_detail_that_recorded_no_limits_reads_as_none(detail: str) -> None:
    assert limits.read_claim(detail) is None


_seconds = st.one_of(
    st.none(), st.floats(min_value=0.001, max_value=1e6, allow_nan=False, allow_infinity=False)
)
_source = st.sampled_from(sorted(limits.CELERY_SOURCES))


@given_examples(
    retries=st.integers(min_value=0, max_value=10_000),
    celery=st.tuples(_seconds, _source, _seconds, _source),
    left=st.floats(min_value=-10, max_value=1e6, allow_nan=False),
    capped=st.booleans(),
)
def test_the_claims_record_reads_back_as_the_limits_the_attempt_was_given(
    retries: int, celery: tuple[Any, str, Any, str], left: float, capped: bool
) -> None:
    from celery_deadlines.rules.gates import cap_time_limits

    hard, hard_by, soft, soft_by = celery
    celery_limits = (hard, hard_by if hard else None, soft, soft_by if soft else None)
    given = cap_time_limits(left, hard, soft, MIN_TIME_LIMIT) if capped else (hard, soft)
    attempt = limits.given((*given, *celery_limits))
    assert attempt is not None
    read = limits.read_claim(limits.claim_detail(retries, attempt))
    assert read is not None

    for recorded, was in ((read.hard, attempt.hard), (read.soft, attempt.soft)):
        assert (recorded.source, recorded.instead_source) == (was.source, was.instead_source)
        for value, exact in ((recorded.seconds, was.seconds), (recorded.instead, was.instead)):
            # kept to the millisecond (three significant digits below it)
            assert value == (None if exact is None else pytest.approx(exact, abs=5e-4, rel=5e-3))
    json.dumps(read)  # plain values


def test_an_eager_claim_says_no_limit_applied() -> None:
    assert limits.read_claim(limits.claim_detail(0, limits.EAGER)) == limits.EAGER
