"""What changes for a project that switches its tasks to DeadlineTask, held as
docs/howto/switching.md says it (the pytest recipe: tests/integration/test_users_test_suites.py).

Under ``ATOMIC_REQUESTS`` every view is one transaction: with the run ledger on, a task
it publishes is written in that transaction and sent when it commits, after the view
returned, so a view that waits for its own task's result waits for a message not sent
yet. A view taken out of the request's transaction sends at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery.signals import after_task_publish
from django.db import connections
from django.test import Client, override_settings

from celery_deadlines.models import Run
from tests.support import switching_urls

pytestmark = pytest.mark.django_db(transaction=True)  # the commits of the requests


@pytest.fixture(autouse=True)
def atomic_requests() -> Iterator[None]:
    """The demo's database under ATOMIC_REQUESTS, the views of a switched project."""
    settings = connections["default"].settings_dict
    before = settings["ATOMIC_REQUESTS"]
    settings["ATOMIC_REQUESTS"] = True

    def sent(headers: dict[str, Any] | None = None, **_: Any) -> None:
        switching_urls.SENT.append((headers or {}).get("id", ""))

    after_task_publish.connect(sent, weak=False)
    try:
        with override_settings(ROOT_URLCONF="tests.support.switching_urls", MIDDLEWARE=[]):
            yield
    finally:
        after_task_publish.disconnect(sent)
        switching_urls.SENT.clear()
        settings["ATOMIC_REQUESTS"] = before


def test_a_task_a_view_publishes_under_atomic_requests_is_sent_after_the_view_returned() -> None:
    seen = Client().get("/atomic/").json()
    assert seen["sent_before_the_view_returned"] is False  # a .get() here would wait
    sent = switching_urls.SENT
    assert sent == [seen["id"]]  # sent when the request's transaction committed
    assert Run.objects.get(task_id=seen["id"]).status == "QUEUED"


def test_a_view_out_of_the_requests_transaction_sends_at_once() -> None:
    seen = Client().get("/non-atomic/").json()
    assert seen["sent_before_the_view_returned"] is True
