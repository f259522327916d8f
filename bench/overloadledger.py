"""The overload benchmark's ledgered DeadlineTask (``bench/overload.py``): the same
task as :mod:`bench.overloadapp`'s header tier, recorded by the run ledger on the
PostgreSQL database of ``BENCH_DATABASE_URL`` (``bench/ledger_settings.py``)."""

from __future__ import annotations

import os
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.ledger_settings")
django.setup()

from celery import Celery  # noqa: E402

from bench.overloadapp import BUDGET, RESERVE, body, configure  # noqa: E402
from celery_deadlines import DeadlineTask  # noqa: E402

app = Celery("overload-ledger")
configure(app)


@app.task(base=DeadlineTask, name="overload.ledgered", budget=BUDGET, reserve=RESERVE, shared=False)
def ledgered(published: float) -> Any:
    return body(published)


before = Celery("overload-ledger-before")
configure(before)
before.conf.deadlines_backlog_refusal = False  # the library before issue 49


@before.task(
    base=DeadlineTask, name="overload.ledgered", budget=BUDGET, reserve=RESERVE, shared=False
)
def ledgered_before(published: float) -> Any:
    return body(published)


@app.task(name="overload.ledger_sentinel", shared=False)
def sentinel() -> str:
    return "ready"
