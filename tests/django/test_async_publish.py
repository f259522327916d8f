"""Publishing from async code (an ASGI view) with the ledger on.

The run's row is a database write, which Django refuses in an async context, as it
refuses the ORM: publish through ``sync_to_async``. The deadline scope goes with it
(asgiref runs the call in a copy of the caller's context).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from celery import Celery
from django.core.exceptions import SynchronousOnlyOperation

from celery_deadlines import DeadlineTask, deadline_scope
from celery_deadlines.core.propagation import inherited
from celery_deadlines.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def task() -> Iterator[Any]:
    app = Celery("async-publish", broker="memory://", set_as_current=False)

    @app.task(base=DeadlineTask, name="shop.reserve", shared=False)
    def reserve(order: int) -> int:
        return order

    yield reserve
    app.close()


def test_async_code_publishes_through_sync_to_async_with_its_scopes_deadline(task: Any) -> None:
    async def view() -> tuple[str, datetime | None]:
        with deadline_scope(budget=30):
            result = await sync_to_async(task.delay)(7)
            return result.id, inherited().deadline

    task_id, deadline = asyncio.run(view())
    run = Run.objects.get(task_id=task_id)
    assert deadline is not None
    assert (run.status, run.deadline) == ("QUEUED", deadline)


def test_a_publish_called_straight_from_async_code_is_refused_by_django(task: Any) -> None:
    async def view() -> None:
        task.delay(7)

    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(view())
    assert not Run.objects.exists()
