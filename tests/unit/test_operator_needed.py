"""A run that needs a person pages once: one ERROR record naming it (what Sentry's
logging integration makes an event of) and the ``operator_needed`` signal; a run whose
task has a reconciler for the effect pages nobody (the workers' reconciler asks it)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_deadlines import DeadlineTask, Found, operator_needed
from celery_deadlines.rules.outcomes import needing_an_operator
from celery_deadlines.testing import FakeClock, FakeLedger, use_ledger


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery(f"page-{uuid.uuid4().hex[:6]}", broker="memory://", backend="cache+memory://")
    yield app
    app.close()


@pytest.fixture
def ledger(clock: FakeClock) -> Iterator[FakeLedger]:
    with use_ledger(FakeLedger()) as fake:
        yield fake


@pytest.fixture
def pages() -> Iterator[list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    def record(sender: Any = None, **fields: Any) -> None:
        sent.append(fields)

    operator_needed.connect(record, weak=False, dispatch_uid="test_operator_needed")
    yield sent
    operator_needed.disconnect(dispatch_uid="test_operator_needed")


class ReplyLost(Exception):
    """The provider took the call, and its reply never came back."""


def paying_task(app: Celery, *, reconciled: bool) -> Any:
    @app.task(base=DeadlineTask, bind=True, name="page.pay", budget=60, shared=False)
    def pay(self: DeadlineTask, order: str) -> None:
        with self.effect("charge", key=f"{order}:charge"):
            raise ReplyLost(order)

    if reconciled:
        pay.reconciler("charge")(lambda pending: Found(result="receipt", evidence="provider"))
    return pay


def test_an_effect_no_reconciler_can_settle_pages_once_naming_the_run(
    app: Celery, ledger: FakeLedger, pages: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="celery_deadlines")
    paying_task(app, reconciled=False).apply(("o-1",), task_id="r-1")
    assert str(app.AsyncResult("r-1").state) == "UNKNOWN"  # what the caller reads
    assert ledger.run("r-1").status == "UNKNOWN"
    [page] = pages
    assert (page["task_id"], page["task_name"], page["keys"]) == ("r-1", "page.pay", ["o-1:charge"])
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    said = record.getMessage()
    assert "page.pay[r-1] needs an operator" in said
    assert "resolve it with evidence" in said
    assert getattr(record, "celery_deadlines.effect_keys") == ["o-1:charge"]


def test_an_effect_its_tasks_reconciler_can_settle_pages_nobody(
    app: Celery, ledger: FakeLedger, pages: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="celery_deadlines")
    paying_task(app, reconciled=True).apply(("o-2",), task_id="r-2")
    assert str(app.AsyncResult("r-2").state) == "UNKNOWN"
    assert pages == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_only_the_effects_without_a_reconciler_need_a_person() -> None:
    effects = {"o:charge": "charge", "o:mail": "mail", "o:ship": "ship"}
    assert needing_an_operator(effects, lambda name: name == "charge") == ["o:mail", "o:ship"]
    assert needing_an_operator(effects, lambda name: True) == []
