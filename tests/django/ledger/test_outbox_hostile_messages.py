"""A recorded message is read as if an attacker wrote its row: the admin, the sweeper,
the operator's requeue and a repeated publish decode it only with a serializer the app
accepts and the task writes, the admin with none that can run code, and nothing of it
runs when it is read.

The hostile row holds a pickle whose loading opens (creates) a marker file: the marker
appearing is the code having run.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, current_app
from django.test import Client
from django.urls import reverse

from celery_deadlines.errors import RunConflict, RunFailed
from celery_deadlines.ledger import operations, outbox
from celery_deadlines.ledger.reconcile import reconcile_once
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.ledger.sql.rows import ExistingRun, NewRun
from celery_deadlines.models import Run, Status
from tests.django.admin.test_runs import login, record
from tests.support.memory_queue import drain

pytestmark = pytest.mark.django_db(transaction=True)

PICKLE = "application/x-python-serialize"


class OpensAFile:
    """Unpickled, it opens ``path`` for writing: the file's existence tells."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.path), "w"))


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "the-pickle-ran"


def pickled_message(marker: Path) -> bytes:
    return pickle.dumps({"args": [OpensAFile(marker)], "kwargs": {}, "options": {}})


def hostile_row(task_id: str, marker: Path, **columns: Any) -> Run:
    """A recorded run whose message an attacker replaced by a pickle."""
    record(Store(), task_id)
    Run.objects.filter(task_id=task_id).update(
        message_body=pickled_message(marker),
        content_type=PICKLE,
        content_encoding="binary",
        op="test",
        **columns,
    )
    return Run.objects.get(task_id=task_id)


@pytest.fixture
def accepting_pickle() -> Iterator[None]:
    """The web process's app accepts pickle too (the admin must still refuse it)."""
    before = current_app.conf.accept_content
    current_app.conf.accept_content = ["json", "pickle"]
    yield
    current_app.conf.accept_content = before


@pytest.mark.usefixtures("accepting_pickle")
def test_a_viewer_opening_a_run_whose_message_is_a_pickle_runs_no_code(
    client: Client, marker: Path
) -> None:
    run = hostile_row("pickled-1", marker)
    login(client)  # a staff user who may only view runs
    response = client.get(reverse("admin:celery_deadlines_run_change", args=[run.pk]))
    assert response.status_code == 200
    assert not marker.exists()
    text = response.content.decode()
    assert "stored as &#x27;application/x-python-serialize&#x27;, which is not decoded here" in text


@pytest.mark.parametrize(
    ("body", "content_type", "encoding", "said"),
    [
        (b"\xff\xfe{", "application/json", "utf-8", "bytes that do not decode"),
        (b'{"args": [1]', "application/json", "utf-8", "bytes that do not decode"),
        (b"[1, 2]", "application/json", "utf-8", "decode to no message"),
        (b'{"args": 5}', "application/json", "utf-8", "decode to no message"),
        (b"raw", "application/data", "binary", "which is not decoded here"),
        (b"x", "x" * 5000, "utf-8", "which is not decoded here"),
    ],
)
def test_a_message_that_cannot_be_decoded_is_said_on_the_run_page_never_a_500(
    client: Client, body: bytes, content_type: str, encoding: str, said: str
) -> None:
    record(Store(), "odd-1")
    Run.objects.filter(task_id="odd-1").update(
        message_body=body, content_type=content_type, content_encoding=encoding, op="test"
    )
    login(client)
    run = Run.objects.get(task_id="odd-1")
    response = client.get(reverse("admin:celery_deadlines_run_change", args=[run.pk]))
    assert response.status_code == 200
    text = response.content.decode()
    assert said in text
    assert "x" * 100 not in text  # a stored content type is cut where it is repeated


@pytest.fixture
def worker_app() -> Iterator[Celery]:
    app = Celery("hostile", broker="memory://", backend="cache+memory://")
    app.conf.update(task_default_queue="q", deadlines_republish_after=60)
    drain(app, "q")
    yield app
    app.close()


@pytest.mark.parametrize("accept_content", [["json"], ["json", "pickle"]])
def test_the_sweeper_publishes_no_pickled_message_and_fails_its_run_telling_the_caller(
    worker_app: Celery, marker: Path, accept_content: list[str]
) -> None:
    """Accepted by the app or not, a pickle is not what a json task's outbox writes."""
    worker_app.conf.accept_content = accept_content
    hostile_row("pickled-2", marker, published_at=Store().database_now() - timedelta(seconds=61))
    report = reconcile_once(worker_app, Store())
    assert not marker.exists()
    assert report.republished == []  # the run is not counted as republished ...
    assert drain(worker_app, "q") == []  # ... and nothing was sent
    run = Run.objects.get(task_id="pickled-2")
    assert (run.status, run.reason) == (Status.FAILED, "message_unreadable")
    assert "not decoded here" in run.detail
    failure = worker_app.AsyncResult("pickled-2").result
    assert isinstance(failure, RunFailed)
    assert failure.reason == "message_unreadable"


def test_an_operators_requeue_of_a_pickled_run_publishes_nothing_and_says_so(
    worker_app: Celery, marker: Path
) -> None:
    run = hostile_row("pickled-3", marker, status=Status.FAILED, reason="error")
    assert not operations.requeue_run(worker_app, Store(), run.pk, operator="ops")
    assert not marker.exists()
    assert drain(worker_app, "q") == []
    assert Run.objects.get(pk=run.pk).reason == "message_unreadable"


def charge_card() -> None:
    """A task body (never run here)."""


def test_a_repeated_publish_compares_no_pickled_row_and_is_refused_as_a_conflict(
    marker: Path,
) -> None:
    body, content_type, encoding = outbox.encode_message("json", [42], {}, {"queue": "shop"})
    existing = ExistingRun(
        task_id="pickled-4",
        task_name="shop.charge_card",
        status=Status.QUEUED,
        message_body=pickled_message(marker),
        content_type=PICKLE,
        content_encoding="binary",
    )
    run = NewRun(
        task_id="pickled-4",
        task_name="shop.charge_card",
        root_id="pickled-4",
        message_body=body,
        content_type=content_type,
        content_encoding=encoding,
    )
    app = Celery("json-tasks", set_as_current=False)
    app.conf.accept_content = ["json", "pickle"]  # the app accepts pickle, its task writes json
    app.task(name="shop.charge_card", shared=False)(charge_card)
    accept = outbox.readable_by_workers(app, "shop.charge_card")
    assert accept == {"application/json"}
    with pytest.raises(RunConflict, match="cannot be compared"):
        outbox.check_repeat(existing, run, accept=accept)
    assert not marker.exists()
    app.close()


def test_a_republished_row_cannot_set_the_options_its_run_owns(worker_app: Celery) -> None:
    """A row's options naming the task id or retries neither crash the sweeper nor
    replace the run's own (the outbox never writes them)."""
    record(Store(), "owned-1")
    body, _, _ = outbox.encode_message("json", [1], {}, {})
    forged = body.replace(b'"options": {}', b'"options": {"task_id": "other", "retries": 99}')
    Run.objects.filter(task_id="owned-1").update(
        message_body=forged,
        published_at=Store().database_now() - timedelta(seconds=61),
        op="test",
    )
    report = reconcile_once(worker_app, Store())
    assert report.republished == ["owned-1"]
    [sent] = drain(worker_app, "q")
    assert (sent["headers"]["id"], sent["headers"]["retries"]) == ("owned-1", 0)
