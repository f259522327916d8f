"""A deadline header the caller writes itself, ``apply_async(headers={"x_deadline": ...})``:
the call's own deadline, as ``deadline=`` is (docs/howto/give-a-task-a-deadline.md).

It is not refused as forged: it says nothing ``deadline=`` cannot say, and a worker
reads whatever header a message carries, however it was published. Outside any scope it
is the message's deadline, in place of the task's budget; inside a task or a scope it
can only shorten the deadline inherited; ``deadlines_max_budget`` bounds it, and a bad
one is refused before anything is published.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_deadlines import (
    DEADLINE_HEADER,
    SOURCE_HEADER,
    InvalidDeadline,
    deadline_scope,
)
from celery_deadlines.rules.wire import encode
from celery_deadlines.testing import FakeClock
from tests.support.unit_tasks import make_task


def test_outside_any_scope_it_is_the_messages_deadline_in_place_of_the_tasks_budget(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    at = clock.now() + timedelta(seconds=60)
    make_task(app, budget=2).apply_async(headers={DEADLINE_HEADER: encode(at)})
    make_task(app, name="unit.iso", budget=2).apply_async(headers={DEADLINE_HEADER: at.isoformat()})
    assert [(h[DEADLINE_HEADER], h[SOURCE_HEADER]) for h in published] == [
        (encode(at), "call"),
        (encode(at), "call"),
    ]


def test_the_source_it_names_is_kept_as_a_label(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    at = encode(clock.now() + timedelta(seconds=60))
    make_task(app).apply_async(headers={DEADLINE_HEADER: at, SOURCE_HEADER: "parent"})
    make_task(app, name="unit.other").apply_async(
        headers={DEADLINE_HEADER: at, SOURCE_HEADER: "the boss"}
    )
    assert [h[SOURCE_HEADER] for h in published] == ["parent", "call"]


def test_inside_a_scope_it_can_only_shorten_the_deadline(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]]
) -> None:
    task = make_task(app)
    with deadline_scope(budget=5, app=app):
        task.apply_async(headers={DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=60))})
        task.apply_async(headers={DEADLINE_HEADER: encode(clock.now() + timedelta(seconds=1))})
    assert [(h[DEADLINE_HEADER], h[SOURCE_HEADER]) for h in published] == [
        (encode(clock.now() + timedelta(seconds=5)), "scope"),
        (encode(clock.now() + timedelta(seconds=1)), "call"),
    ]


@pytest.mark.parametrize(
    ("header", "complaint"),
    [
        (lambda now: encode(now + timedelta(days=8)), "more than 7 days"),
        (lambda now: "tomorrow", "not a number or ISO-8601"),
        (lambda now: now.replace(tzinfo=None).isoformat(), "offset"),
    ],
    ids=["beyond-the-maximum-budget", "unreadable", "naive"],
)
def test_a_bad_one_is_refused_and_nothing_is_published(
    app: Celery, clock: FakeClock, published: list[dict[str, Any]], header: Any, complaint: str
) -> None:
    with pytest.raises(InvalidDeadline, match=complaint):
        make_task(app).apply_async(headers={DEADLINE_HEADER: header(clock.now())})
    assert published == []
