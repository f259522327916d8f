"""What the database cap costs a body: 100 small queries with and without it, side by side.

A body of 100 small queries (``SELECT %s`` on a Django cursor, each a round trip) runs
as a DeadlineTask's body runs them: inside the cap (:func:`celery_deadlines.core.database.
capped`, entered and left once per body, as ``DeadlineTask.__call__`` does: its settings
sent once, reset at the end) with 30 s left, and without it, alternately (A, B, A, B...)
so that the machine's load falls on both alike. Per alias: PostgreSQL (``PG_URL``, the
``postgres`` database on 127.0.0.1 by default: nothing is written) and SQLite in memory.
Prints each variant's median time per body and the ratio; what the cap costs once per
body (from bodies of one query, alternated the same way) and then per query; and what one
capped body sends besides its own statements (its settings and their reset).

Usage: python bench/database_cap.py [--bodies 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

QUERIES = 100


def setup() -> None:
    import dj_database_url
    import django
    from django.conf import settings

    settings.configure(
        USE_TZ=True,
        INSTALLED_APPS=[],
        DATABASES={
            "default": dj_database_url.parse(
                os.environ.get("PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")
            ),
            "local": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
        },
    )
    django.setup()


def body(alias: str, queries: int = QUERIES) -> None:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        for number in range(queries):
            cursor.execute("SELECT %s", [number])
            cursor.fetchone()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bodies", type=int, default=300)
    bodies = parser.parse_args().bodies
    setup()
    from celery import Celery
    from django.db import connections

    from celery_deadlines.clock import get_clock
    from celery_deadlines.core import database
    from celery_deadlines.rules.budgets import Anchor

    app = Celery("bench", set_as_current=False)
    clock = get_clock()
    for alias in ("default", "local"):
        timings: dict[str, list[float]] = {"without": [], "with": []}
        sent: list[str] = []
        body(alias)  # connect, warm up
        one: dict[str, list[float]] = {"without": [], "with": []}
        for _ in range(bodies):
            for variant in ("without", "with"):
                for queries, times in ((QUERIES, timings), (1, one)):
                    anchor = Anchor.at(
                        datetime.now(UTC) + timedelta(seconds=30), clock.now(), clock.monotonic()
                    )
                    started = time.perf_counter()
                    if variant == "with":
                        with database.capped(app, anchor):
                            body(alias, queries)
                    else:
                        body(alias, queries)
                    times[variant].append(time.perf_counter() - started)
        # what one capped body sends besides its own statements (counted apart)
        calls = {"set": 0, "reset": 0}
        send, reset = database._Cap._send, database._Cap._reset

        def counted_send(
            cap: Any, *args: Any, calls: dict[str, int] = calls, send: Any = send, **kwargs: Any
        ) -> None:
            calls["set"] += 1
            send(cap, *args, **kwargs)

        def counted_reset(cap: Any, calls: dict[str, int] = calls, reset: Any = reset) -> None:
            calls["reset"] += 1
            reset(cap)

        database._Cap._send, database._Cap._reset = counted_send, counted_reset  # type: ignore[method-assign,assignment]
        anchor = Anchor.at(
            datetime.now(UTC) + timedelta(seconds=30), clock.now(), clock.monotonic()
        )
        with database.capped(app, anchor):
            body(alias)
        database._Cap._send, database._Cap._reset = send, reset  # type: ignore[method-assign]
        sent.append(f"{calls['set']} setting, {calls['reset']} reset")
        without = statistics.median(timings["without"])
        capped = statistics.median(timings["with"])
        # a body of one query: what the cap costs once per body (its setting and reset)
        fixed = statistics.median(one["with"]) - statistics.median(one["without"])
        print(
            f"{connections[alias].vendor:<10} {QUERIES} queries per body, {bodies} bodies each: "
            f"without the cap {without * 1e3:.2f} ms, with it {capped * 1e3:.2f} ms "
            f"(ratio {capped / without:.3f}); once per body {fixed * 1e6:+.0f} µs, "
            f"then {(capped - without - fixed) / (QUERIES - 1) * 1e6:+.1f} µs a query; "
            f"sent besides the body's statements: {sent[0]}"
        )


if __name__ == "__main__":
    main()
