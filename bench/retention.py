"""Retention on a ledger of a million ended runs (PostgreSQL): time per purge batch, the plan.

Creates a scratch database (dropped at the end unless ``--keep``), migrates it to 0006,
fills it with ``INSERT ... SELECT generate_series``:

* ``--runs`` ended runs (SUCCEEDED, FAILED, EXPIRED) that ended 30 to 41 days ago, three
  events each, one in ten with a settled effect (SUCCEEDED);
* a tenth as many ended a day ago (younger than the retention) and a twentieth as many
  not ended (QUEUED, RUNNING, UNKNOWN, PAUSED) and old: the purge must leave both;
* a thousand old EXPIRED runs with an UNKNOWN effect: kept for their effects;

then times migration 0007 (the partial index ``cdl_run_ended_idx`` is built on the full
table), prints the plan of each statement of a batch (``EXPLAIN (ANALYZE, BUFFERS)`` of
the selection, rolled back), times the dry run's counts, and purges with a retention of
14 days in batches of ``--batch-size`` (one transaction each, as a worker does), printing
the time per batch (median, 95th percentile, worst) every ``--report`` batches.

Usage: python bench/retention.py [--runs 1000000] [--batch-size 500] [--batches N] [--keep]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DATABASE = f"cd_retention_{uuid.uuid4().hex[:6]}"
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
RETENTION = timedelta(days=14)

RUN_COLUMNS = (
    "task_id, task_name, status, reason, detail, root_id, parent_id, retries, attempt, "
    "lost_leases, owner, lease_token, version, checkpoint_name, content_type, "
    "content_encoding, op, op_detail, created_at, updated_at"
)


def setup_django() -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["celery_deadlines"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": DATABASE,
                "USER": "postgres",
                "HOST": "127.0.0.1",
                "PORT": "5432",
            }
        },
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement (without ``params``, a ``%`` is a ``%``)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def insert_runs(prefix: str, count: int, status: str, ended: str) -> None:
    """``count`` runs; ``status`` and ``ended`` are SQL expressions of ``n`` (1..count)."""
    sql(
        f"""
        INSERT INTO celery_deadlines_run ({RUN_COLUMNS})
        SELECT '{prefix}-' || n, 'bench.task', {status}, '', '', '', '', 0, 1, 0, '', 1, 3,
            '', '', '', 'succeed', '', {ended} - interval '1 minute', {ended}
        FROM generate_series(1, {count}) AS n
        """
    )


def fill(runs: int) -> None:
    from bench import ledger_fill

    started = time.perf_counter()
    with ledger_fill.triggers_off(sql):
        ended_status = "(ARRAY['SUCCEEDED', 'FAILED', 'EXPIRED'])[1 + n % 3]"
        # one second apart, from 30 days ago backwards (a million runs span 11.6 days)
        insert_runs(
            "old", runs, ended_status, "now() - interval '30 days' - n * interval '1 second'"
        )
        insert_runs("young", runs // 10, ended_status, "now() - interval '1 day'")
        insert_runs(
            "live",
            runs // 20,
            "(ARRAY['QUEUED', 'RUNNING', 'UNKNOWN', 'PAUSED'])[1 + n % 4]",
            "now() - interval '60 days'",
        )
        insert_runs("kept", 1000, "'EXPIRED'", "now() - interval '45 days'")
        ledger_fill.events(sql, "true")
        ledger_fill.effects(sql, "r.task_id LIKE 'old-%%' AND r.id %% 10 = 0", "SUCCEEDED")
        ledger_fill.effects(sql, "r.task_id LIKE 'kept-%%'", "UNKNOWN")
    print(f"filled in {time.perf_counter() - started:.1f} s: {counts()}")


def counts() -> str:
    tables = ("run", "runevent", "effect", "runplan")
    found = [
        f"{sql(f'SELECT count(*) FROM celery_deadlines_{table}')[0][0]:,} {table}s"
        for table in tables
    ]
    return ", ".join(found)


def show_plans(store: Any, before: Any, batch_size: int, after: Any = None) -> None:
    """The plan of a batch's selection (executed: ``EXPLAIN (ANALYZE, BUFFERS)``, in a
    transaction rolled back) and of its deletes (``EXPLAIN``)."""
    from django.db import transaction

    retention = store.retention
    select = retention.select_sql(after=after is not None)
    params = {"cutoff": before, "limit": batch_size, "after": after}
    with transaction.atomic():  # executes, and locks: rolled back
        rows = sql("EXPLAIN (ANALYZE, BUFFERS) " + select, params)
        ids = [row[0] for row in sql(select, params)]  # its own locks: not skipped
        transaction.set_rollback(True)
    print("  select (EXPLAIN ANALYZE, BUFFERS):")
    print("\n".join(f"    {row[0]}" for row in rows))
    for what, statement in retention.deletes():
        plan = [shorten(row[0].strip()) for row in sql("EXPLAIN " + statement, {"ids": ids})]
        print(f"  delete {what} (EXPLAIN): " + " / ".join(plan[:4]))


def shorten(line: str) -> str:
    """A plan line with its list of run ids elided."""
    return re.sub(r"'\{[0-9,]+\}'", "'{...ids}'", re.sub(r"\([0-9, ]{40,}\)", "(...ids)", line))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--batches", type=int, default=None, help="stop after N batches")
    parser.add_argument("--report", type=int, default=200, help="a line every N batches")
    parser.add_argument("--middle", type=int, default=1000, help="explain after N batches")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{DATABASE}"')
    try:
        setup_django()
        from django.core.management import call_command

        from celery_deadlines.ledger.sql.connection import Store
        from celery_deadlines.rules.retention import cutoff

        print(f"scratch database {DATABASE}; PostgreSQL {sql('SHOW server_version')[0][0]}")
        call_command("migrate", "celery_deadlines", "0006", verbosity=0)
        fill(args.runs)
        started = time.perf_counter()
        call_command("migrate", "celery_deadlines", "0007", verbosity=0)
        print(
            f"migration 0007 (asked_at, cdl_run_ended_idx): {time.perf_counter() - started:.2f} s"
        )
        sql("ANALYZE celery_deadlines_run")

        store = Store("default")
        before = cutoff(store.database_now(), RETENTION)
        print(f"\nthe first batch's statements, {args.batch_size} runs, retention 14 days:")
        show_plans(store, before, args.batch_size)

        started = time.perf_counter()
        preview = store.retention.preview(before)
        print(
            f"\ndry run: {preview.runs:,} runs ({preview.events:,} events, {preview.effects:,} "
            f"effects) would go, {preview.kept:,} kept; counted in "
            f"{time.perf_counter() - started:.2f} s"
        )

        print(f"\npurging in batches of {args.batch_size} (one transaction each):")
        times: list[float] = []
        window: list[float] = []
        purged, after = 0, None
        total_started = time.perf_counter()
        while args.batches is None or len(times) < args.batches:
            started = time.perf_counter()
            batch = store.retention.purge_batch(before, args.batch_size, after)
            elapsed = time.perf_counter() - started
            if not batch.selected:
                break
            purged, after = purged + batch.counts.runs, batch.last
            times.append(elapsed)
            window.append(elapsed)
            if len(window) == args.report:
                report(len(times), purged, window)
                window = []
            if len(times) == args.middle:
                print(f"\n  the selection of batch {len(times) + 1} (from where the last stopped):")
                show_plans(store, before, args.batch_size, after)
                print()
        if window:
            report(len(times), purged, window)
        total = time.perf_counter() - total_started
        print(
            f"all: {len(times)} batches, {purged:,} runs in {total:.1f} s "
            f"({purged / total:,.0f} runs/s); per batch {summary(times)}"
        )
        print(f"left: {counts()}")
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


def summary(times: list[float]) -> str:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return (
        f"median {statistics.median(ordered) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, "
        f"worst {ordered[-1] * 1000:.0f} ms"
    )


def report(batches: int, purged: int, window: list[float]) -> None:
    first = batches - len(window) + 1
    print(f"  batches {first}-{batches}: {purged:,} runs so far; {summary(window)}")


if __name__ == "__main__":
    os.environ.pop("DJANGO_SETTINGS_MODULE", None)
    main()
