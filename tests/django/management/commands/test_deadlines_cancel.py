"""The operator's cancel (issue 48): ``manage.py deadlines cancel`` and the admin's
"Cancel with everything it started", behind a permission of its own; and the public
``celery_deadlines.cancel`` on the ledger's database (SQLite, the demo's default)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

import celery_deadlines
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.models import Run, RunEvent, Status
from tests.django.admin.test_runs import login
from tests.django.ledger.test_operations_cancel import tree

pytestmark = pytest.mark.django_db(transaction=True)


def cancelled() -> list[str]:
    return sorted(Run.objects.filter(reason="cancelled").values_list("task_id", flat=True))


def test_the_command_cancels_a_run_and_everything_it_started_and_says_how_many() -> None:
    tree(Store("default"))
    out = StringIO()
    call_command("deadlines", "cancel", "reserve", "--reason", "bad deploy", stdout=out)
    assert out.getvalue().strip() == "3 run(s) cancelled: reserve and what it started"
    assert cancelled() == ["notify", "reserve", "ship"]
    event = RunEvent.objects.filter(run__task_id="ship", kind="cancel").get()
    assert event.detail == "cancelled by manage.py deadlines cancel: bad deploy"


def test_the_command_says_when_nothing_was_cancelled_and_requires_a_reason() -> None:
    out = StringIO()
    call_command("deadlines", "cancel", "gone", "--reason", "x", "--by", "alice", stdout=out)
    assert out.getvalue().startswith("nothing cancelled: gone had ended")
    with pytest.raises(CommandError, match="--reason"):
        call_command("deadlines", "cancel", "gone")


def test_the_admins_cancel_needs_its_own_permission(client: Client) -> None:
    tree(Store("default"))
    login(client, "expire_run", "requeue_run")
    page = client.get(reverse("admin:celery_deadlines_run_changelist")).content.decode()
    assert "cancel_tree" not in page
    reserve = Run.objects.get(task_id="reserve")
    client.post(
        reverse("admin:celery_deadlines_run_changelist"),
        {"action": "cancel_tree", "_selected_action": [reserve.pk]},
    )
    assert cancelled() == []


def test_the_admins_cancel_pulls_in_the_tree_and_leaves_a_log_entry(client: Client) -> None:
    tree(Store("default"))
    login(client, "cancel_run")
    page = client.get(reverse("admin:celery_deadlines_run_changelist")).content.decode()
    assert "Cancel with everything it started" in page
    reserve = Run.objects.get(task_id="reserve")
    client.post(
        reverse("admin:celery_deadlines_run_changelist"),
        {"action": "cancel_tree", "_selected_action": [reserve.pk]},
    )
    assert cancelled() == ["notify", "reserve", "ship"]
    assert (
        Run.objects.get(task_id="ship").detail
        == "cancelled by operator ops: cancelled in the admin"
    )
    entry = LogEntry.objects.get(object_id=str(reserve.pk))
    assert "Cancelled with 3 run(s) of its tree" in entry.get_change_message()


def test_the_public_cancel_returns_0_for_a_finished_run_and_refuses_a_naive_instant() -> None:
    from datetime import datetime

    from celery import Celery

    # an app of the test's own, on this database (the process's current app is whichever
    # another test made current)
    app = Celery("canceller", broker="memory://", set_as_current=False)
    app.conf.deadlines_database = "default"
    tree(Store("default"))
    Run.objects.filter(task_id="pay").update(status=Status.SUCCEEDED)
    assert celery_deadlines.cancel("pay", reason="late", app=app) == 0
    with pytest.raises(ValueError, match="naive"):
        celery_deadlines.cancel("checkout", at=datetime(2026, 1, 1), app=app)
    assert celery_deadlines.cancel("checkout", reason="abandoned", app=app) == 4
