"""The operator's console at scale: every query the run and effect list pages send (the
list, a page deep in it, each filter, each kind of search, every level of the date
hierarchy, the sort the list offers) and a run's page is planned on PostgreSQL without
a sequential scan of the run, effect or event table.

Why this holds at a million runs when it passes here: the ledger is filled with
:data:`RUNS` runs (set-based SQL, ``bench/ledger_fill.console_runs``: 13 task names
from one run in 4,096 to half of them, 5 queues, rare and common statuses and reasons,
three events each, an effect for every fifth) and vacuumed and analysed, so the planner
knows the sizes and the skew. At this size a sequential scan already costs more than
any index path of a list page; the planner's choice between two index paths can move
with the size (the pages are bounded either way: ``LIMIT 50``, a count capped at
:data:`~celery_deadlines.admin.listing.EXACT_UP_TO`, one probe per filter value or
period), but a sequential scan only becomes dearer with more rows. ``python
bench/ledger_scale.py`` times the same pages at 10^4 and 10^6 runs.

Each page's plans must also name the index that page is for (the date hierarchy
``cdl_run_created_idx``, a task filter ``cdl_run_task_name_idx``, ...): a page whose
query stopped reaching its index fails here, whatever else it plans.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings

from bench import ledger_fill
from celery_deadlines.admin import EffectAdmin, RunAdmin
from celery_deadlines.admin.listing import EXACT_UP_TO
from celery_deadlines.models import Effect, Run
from tests.conftest import service_unavailable
from tests.support.processes import reachable

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgres"])

#: Runs in the ledger: enough that the planner weighs the table as a large one.
RUNS = 150_000
#: The period they were created over (the date hierarchy has two years to show).
DAYS = 400
#: A scan of the whole run, effect or event table.
SEQUENTIAL = re.compile(r"Seq Scan on (celery_deadlines_(?:run|effect|runevent))\b")


class LedgerOnPostgres:
    """Routes the ledger's models to the ``postgres`` alias (the admin's users and
    sessions stay on ``default``), so the admin's pages read the filled ledger."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return "postgres" if model._meta.app_label == "celery_deadlines" else None

    db_for_write = db_for_read


@dataclass(frozen=True)
class Filled:
    """What the pages look for: ids, keys and periods that exist in the ledger."""

    task_id: str
    root_id: str
    key: str
    unknown_pk: int
    succeeded_pk: int
    year: int
    month: int
    day: int


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    with connections["postgres"].cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def fill(runs: int) -> None:
    if not reachable("127.0.0.1", 5432):
        service_unavailable("PostgreSQL 127.0.0.1:5432")
    with ledger_fill.triggers_off(functools.partial(sql)):
        ledger_fill.console_runs(functools.partial(sql), 1, runs, days=DAYS)
    for table in ("run", "effect", "runevent"):
        sql(f"VACUUM ANALYZE celery_deadlines_{table}")  # as autovacuum leaves a table


@pytest.fixture
def filled() -> Iterator[Filled]:
    fill(RUNS)
    runs = Run.objects.using("postgres")
    unknown = runs.filter(status="UNKNOWN").order_by("-id").first()
    assert unknown is not None
    child = runs.exclude(parent_id="").order_by("-id").first()
    assert child is not None
    newest = runs.order_by("-id").first()
    assert newest is not None
    effect = Effect.objects.using("postgres").filter(run=unknown).get()
    at = newest.created_at
    succeeded = runs.filter(status="SUCCEEDED").order_by("-id").first()
    assert succeeded is not None
    with override_settings(DATABASE_ROUTERS=[LedgerOnPostgres()]):
        yield Filled(
            task_id=child.task_id,
            root_id=child.root_id,
            key=effect.key,
            unknown_pk=unknown.pk,
            succeeded_pk=succeeded.pk,
            year=at.year,
            month=at.month,
            day=at.day,
        )


def pages(f: Filled) -> dict[str, tuple[str, str]]:
    """Each page an operator opens, and the index its own query must reach:
    ``name -> (url, index)``."""
    runs = "/admin/celery_deadlines/run/"
    effects = "/admin/celery_deadlines/effect/"
    y, m, d = f.year, f.month, f.day
    # the list's columns are numbered after its action checkbox
    created = 1 + RunAdmin.list_display.index("created_and_time_left")
    return {
        "the run list": (runs, "cdl_run_created_idx"),
        "page 100": (f"{runs}?p=100", "cdl_run_created_idx"),
        "status: a common one": (f"{runs}?status__exact=SUCCEEDED", "celery_deadlines_run"),
        "status: a rare one": (f"{runs}?status__exact=UNKNOWN", "cdl_run_status_lease_idx"),
        "reason": (f"{runs}?reason=retry_budget_exhausted", "cdl_run_reason_idx"),
        "reason: the filter's choices": (runs, "cdl_run_reason_idx"),
        "task: a rare one": (f"{runs}?task_name=shop.tasks.step_0", "cdl_run_task_name_idx"),
        "task: a common one": (f"{runs}?task_name=shop.tasks.step_11", "cdl_run_task_name_idx"),
        "task: the filter's choices": (runs, "cdl_run_task_name_idx"),
        "queue": (f"{runs}?queue=reports", "cdl_run_queue_idx"),
        "queue: a common one": (f"{runs}?queue=celery", "cdl_run_queue_idx"),
        "queue: not recorded": (f"{runs}?queue__isnull=True", "cdl_run_queue_idx"),
        "created: past 7 days": (
            f"{runs}?"
            + urlencode(
                {
                    "created_at__gte": f"{y}-{m:02}-{d:02} 00:00:00+00:00",
                    "created_at__lt": "2999-01-01 00:00:00+00:00",
                }
            ),
            "celery_deadlines_run",
        ),
        "search: part of a task name": (f"{runs}?q=STEP_3", "cdl_run_task_name_idx"),
        "search: a task id": (f"{runs}?q={f.task_id}", "cdl_run_task_id_uniq"),
        "search: the short id": (f"{runs}?q={f.task_id[:8]}…", "cdl_run_task_id_uniq"),
        "search: a root id": (f"{runs}?q={f.root_id}", "cdl_run_root_idx"),
        "search: an effect key": (f"{runs}?q={f.key}", "cdl_effect_key_uniq"),
        "dates: the years": (runs, "cdl_run_created_idx"),
        "dates: a year's months": (f"{runs}?created_at__year={y}", "cdl_run_created_idx"),
        "dates: a month's days": (
            f"{runs}?created_at__year={y}&created_at__month={m}",
            "cdl_run_created_idx",
        ),
        "dates: a day": (
            f"{runs}?created_at__year={y}&created_at__month={m}&created_at__day={d}",
            "cdl_run_created_idx",
        ),
        "sorted by creation": (f"{runs}?o={created}", "cdl_run_created_idx"),
        "sorted by creation, newest first": (f"{runs}?o=-{created}", "cdl_run_created_idx"),
        # a URL asking to sort by a column that has no index: not sorted by it
        **{
            f"asked to sort by column {column}": (f"{runs}?o={column}", "cdl_run_created_idx")
            for column in range(1, len(RunAdmin.list_display) + 1)
            if column != created
        },
        "filters, search and a date at once": (
            f"{runs}?status__exact=FAILED&q=step_5&created_at__year={y}",
            "cdl_run_task_name_idx",
        ),
        "a run with an unknown effect": (
            f"{runs}{f.unknown_pk}/change/",
            "cdl_event_run_idx",
        ),
        "a run that succeeded": (f"{runs}{f.succeeded_pk}/change/", "cdl_effect_run_idx"),
        "the effect list": (effects, "celery_deadlines_effect_pkey"),
        "effects: page 20": (f"{effects}?p=20", "celery_deadlines_effect_pkey"),
        "effects: unknown": (f"{effects}?state__exact=UNKNOWN", "cdl_effect_state_idx"),
        "effects: deliveries": (f"{effects}?kind__exact=delivery", "cdl_effect_kind_idx"),
        "effects: a name": (f"{effects}?name=charge", "cdl_effect_name_idx"),
        "effects: the name filter's choices": (effects, "cdl_effect_name_idx"),
        "effects: a key": (f"{effects}?q={f.key}", "cdl_effect_key_uniq"),
        **{
            f"effects: asked to sort by column {column}": (
                f"{effects}?o={column}",
                "celery_deadlines_effect",
            )
            for column in range(1, len(EffectAdmin.list_display) + 1)
        },
    }


def plan_of(statement: str) -> list[str]:
    return [str(row[0]) for row in sql(f"EXPLAIN {statement}")]


def test_every_query_of_the_list_pages_reads_an_index_at_scale(
    client: Client, filled: Filled
) -> None:
    client.force_login(User.objects.create_superuser("night-shift", password="pw"))
    problems: list[str] = []
    for name, (url, index) in pages(filled).items():
        with CaptureQueriesContext(connections["postgres"]) as captured:
            response = client.get(url)
        assert response.status_code == 200, f"{name}: {url} answered {response.status_code}"
        statements = [
            q["sql"] for q in captured.captured_queries if not q["sql"].startswith("EXPLAIN")
        ]
        assert statements, f"{name}: {url} sent no query to the ledger's database"
        plans = {statement: plan_of(statement) for statement in statements}
        for statement, plan in plans.items():
            scanned = sorted({m[1] for line in plan if (m := SEQUENTIAL.search(line))})
            if scanned:
                problems.append(
                    f"{name} ({url}) scans {', '.join(scanned)} whole:\n  {statement}\n    "
                    + "\n    ".join(plan)
                )
        if not any(index in line for plan in plans.values() for line in plan):
            problems.append(f"{name} ({url}): no plan reaches {index}")
    assert problems == [], "\n\n".join(problems)


def test_a_long_list_says_about_how_many_runs_it_holds_and_counts_a_short_one_exactly(
    client: Client,
) -> None:
    fill(3 * EXACT_UP_TO)
    client.force_login(User.objects.create_superuser("night-shift", password="pw"))
    with override_settings(DATABASE_ROUTERS=[LedgerOnPostgres()]):
        every = client.get("/admin/celery_deadlines/run/").content.decode()
        rare = client.get(
            "/admin/celery_deadlines/run/", {"task_name": "shop.tasks.step_0"}
        ).content.decode()
    estimate = re.search(r"about</span> (\d+) runs", every)
    assert estimate is not None, "no estimate said as one"
    assert 2 * EXACT_UP_TO < int(estimate[1]) < 4 * EXACT_UP_TO
    exact = Run.objects.using("postgres").filter(task_name="shop.tasks.step_0").count()
    assert f"\n{exact} runs" in rare
    assert "about</span>" not in rare


def test_a_cancel_of_a_tree_reads_the_runs_by_their_indexes_at_scale(filled: Filled) -> None:
    # the admin's "Cancel with everything it started", on a root of the filled ledger:
    # its recursion walks parent_id down the index, never the whole run table
    from celery_deadlines.ledger.sql.operator import CANCEL

    params = {"task_id": filled.root_id, "detail": "plan", "at": None}
    plan = [str(row[0]) for row in sql(f"EXPLAIN {CANCEL.text['postgresql']}", params)]
    scanned = [line for line in plan if SEQUENTIAL.search(line)]
    assert scanned == [], "\n".join(plan)
    assert any("cdl_run_parent_idx" in line for line in plan), "\n".join(plan)
