"""The ledger at two sizes, measured side by side (``bench/ledger.py`` runs it).

Two throw-away databases, migrated alike (Django aliases ``small`` and ``large`` of
``bench/ledger_settings.py``): the same live set in both (runs waiting, running, and a
few UNKNOWN with an unresolved effect), and a history of ended runs (three events each,
one in ten with a settled effect) of ``--scale-small`` runs in one and ``--scale``
runs in the other, written with ``INSERT ... SELECT generate_series`` (triggers off,
then ``ANALYZE``). Each statement is then timed on both, alternating sample by sample,
so the machine's load swings touch both sizes alike; the medians are compared.

Then the operator's console on both (:func:`admin_pages`): the admin's run and effect
list pages (the list, page 200, each kind of search, each filter, the date hierarchy's
months and days, the effect list, one run's page) through Django's test client as a
superuser, alternating sizes, each page's median and the ratio. The ended runs carry
13 task names (each twice as common as the one before), 5 queues and their reasons
(``bench/ledger_fill.py``), created over the same 30 days at both sizes.

Also here: where a run's milliseconds go on the small ledger (the producer's row, the
claim, a lost claim, the completion, django-celery-results' ``store_result``), with the
server's own share of the claim and the completion (``EXPLAIN ANALYZE``: planning,
execution, the audit trigger), and the plans of the sweeper's statements on the large.
"""

from __future__ import annotations

import contextlib
import functools
import re
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

from bench import ledger_fill

#: the live set, the same at both sizes: (prefix, count, status)
LIVE = (("waiting", 200, "QUEUED"), ("running", 100, "RUNNING"), ("unknown", 10, "UNKNOWN"))
RUN_COLUMNS = (
    "task_id, task_name, status, reason, detail, deadline, root_id, parent_id, retries, "
    "attempt, lost_leases, owner, lease_token, version, checkpoint_name, content_type, "
    "content_encoding, published_at, lease_expires_at, op, op_detail, created_at, "
    "updated_at, queue"
)
#: An ended run's reason, by its status (as the console's filter meets them).
ENDED_REASON = (
    "CASE WHEN {status} = 'FAILED' THEN (ARRAY['error', 'time_limit'])[1 + mod(n, 2)] "
    "WHEN {status} = 'EXPIRED' THEN (ARRAY['deadline_passed', 'retry_budget_exhausted', "
    "'insufficient_budget'])[1 + mod(n, 3)] ELSE '' END"
)


def sql(alias: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def insert_runs(alias: str, prefix: str, first: int, count: int, status: str) -> None:
    """Runs ``prefix-first .. prefix-(first+count-1)``; ended ones ended over the last
    30 days (spread alike at any size), with the console's task names, queues and
    reasons; live ones due in an hour (running: leased for an hour)."""
    ended = status in ("SUCCEEDED", "FAILED", "EXPIRED") or status.startswith("(")
    last = first + count - 1
    # ids and instants rise together, as a ledger's rows are written
    at = (
        f"now() - (({last} - n) * 2592.0 / {count}) * interval '1000 seconds'" if ended else "now()"
    )
    lease = "now() + interval '1 hour'" if status == "RUNNING" else "NULL"
    row_status = status if ended else f"'{status}'"
    if ended:
        name, reason = ledger_fill.TASK_NAME_OF_N, ENDED_REASON.format(status=row_status)
        queue = ledger_fill.QUEUE_OF_N
    else:
        name, reason, queue = "'bench.task'", "''", "'celery'"
    sql(
        alias,
        f"""
        INSERT INTO celery_deadlines_run ({RUN_COLUMNS})
        SELECT '{prefix}-' || n, {name}, {row_status}, {reason}, '',
            now() + interval '1 hour', '', '', 0, 1, 0, 'w', 1, 3, '', '', '',
            {at} - interval '1 minute', {lease}, 'bench', '', {at} - interval '1 minute', {at},
            {queue}
        FROM generate_series({first}, {last}) AS n
        """,
    )


def fill(alias: str, history: int, already: int = 0) -> None:
    """``history`` ended runs (numbered after ``already``), their events and effects;
    the live set when ``already`` is 0."""
    execute = functools.partial(sql, alias)
    numbered = f"substr(r.task_id, 7)::int BETWEEN {already + 1} AND {already + history}"
    with ledger_fill.triggers_off(execute):
        status = "(ARRAY['SUCCEEDED', 'SUCCEEDED', 'FAILED', 'EXPIRED'])[1 + n % 4]"
        insert_runs(alias, "ended", already + 1, history, status)
        if not already:
            for prefix, count, live in LIVE:
                insert_runs(alias, prefix, 1, count, live)
        ledger_fill.events(execute, f"r.task_id LIKE 'ended-%%' AND {numbered}")
        ledger_fill.effects(
            execute,
            f"r.task_id LIKE 'ended-%%' AND substr(r.task_id, 7)::int %% 10 = 0 AND {numbered}",
            "SUCCEEDED",
        )
        if not already:
            ledger_fill.effects(execute, "r.task_id LIKE 'unknown-%%'", "UNKNOWN")


def runs_in(alias: str) -> int:
    return int(sql(alias, "SELECT count(*) FROM celery_deadlines_run")[0][0])


class Ledger:
    """One size's stores and the next fresh run."""

    def __init__(self, alias: str) -> None:
        from celery_deadlines.ledger.sql.connection import Store

        self.alias = alias
        self.producer = Store(alias)
        self.worker = Store(alias, dedicated=True)
        self.made = 0

    def new_run(self) -> str:
        from celery_deadlines.ledger.sql.rows import NewRun

        self.made += 1
        task_id = f"bench-{uuid.uuid4().hex}"
        self.producer.outbox.enqueue(
            NewRun(
                task_id=task_id,
                task_name="bench.ledgered",
                deadline=datetime.now(UTC) + timedelta(minutes=5),
                delivery_deadline=None,
                root_id=task_id,
                parent_id="",
                retries=0,
                available_at=None,
                message_body=b'{"args": [1], "kwargs": {}}',
                content_type="application/json",
                content_encoding="utf-8",
            )
        )
        return task_id

    def claim(self, task_id: str, owner: str = "bench@host:1") -> Any:
        return self.worker.runs.claim(
            task_id,
            0,
            task_name="bench.ledgered",
            owner=owner,
            ttl=timedelta(minutes=1),
            reserve=timedelta(0),
            max_lost_leases=3,
        )


def timed(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def sample(ledger: Ledger) -> dict[str, float]:
    """One run's life on ``ledger``, each statement timed (seconds)."""
    from celery_deadlines.explain.facts import explanation_of
    from celery_deadlines.rules.states import Status

    worker = ledger.worker
    out: dict[str, float] = {}
    task_id = ledger.new_run()
    lease: Any = None

    def claim() -> None:
        nonlocal lease
        lease = ledger.claim(task_id)

    out["claim"] = timed(claim)
    key = f"effect-{task_id}"
    worker.effects.record_intent(lease, key, "charge", "execution", "f")
    out["effect guard"] = timed(lambda: worker.effects.dispatch(lease, key))
    worker.effects.succeed(lease, key, {"ok": True})
    out["completion"] = timed(lambda: worker.runs.finish(lease, lease_owner(), Status.SUCCEEDED))
    out["sweeper pass"] = timed(lambda: sweeper_pass(worker))
    out["explain"] = timed(lambda: explanation_of(task_id, ledger.alias))
    return out


def lease_owner() -> str:
    return "bench@host:1"


def sweeper_pass(store: Any) -> None:
    """The reconciler's statements of one pass over a ledger with nothing due."""
    store.sweeps.expire_unclaimed()
    store.sweeps.lapsed_leases()
    store.effects.pending()
    store.effects.settled_unknown()
    store.sweeps.unclaimed(timedelta(seconds=60), held=True)


def lifecycle(ledger: Ledger, samples: int) -> None:
    """Where a run's milliseconds go: each statement of a run's life, and what
    django-celery-results' worker write costs on the same database."""
    from celery import Celery
    from django_celery_results.backends.database import DatabaseBackend

    backend = DatabaseBackend(app=Celery("bench", set_as_current=False))
    times: dict[str, list[float]] = {}
    for _ in range(samples):
        for name, seconds in life(ledger, backend).items():
            times.setdefault(name, []).append(seconds)
    print(f"where a run's time goes ({samples} runs, median, one statement each):")
    for name, values in times.items():
        print(f"  {name:42s} {statistics.median(values) * 1000:6.2f} ms")
    ledger_total = sum(
        statistics.median(times[n])
        for n in ("producer's row (outbox insert)", "claim (won)", "completion")
    )
    print(f"  {'ledger per run (row + claim + completion)':42s} {ledger_total * 1000:6.2f} ms")
    server_share(ledger)


def life(ledger: Ledger, backend: Any) -> dict[str, float]:
    """One run's statements on ``ledger``, and one django-celery-results write, timed."""
    from celery_deadlines.rules.states import Status

    clock = time.perf_counter
    got: dict[str, float] = {}
    started = clock()
    task_id = ledger.new_run()
    got["producer's row (outbox insert)"] = clock() - started
    started = clock()
    lease = ledger.claim(task_id)
    got["claim (won)"] = clock() - started
    started = clock()
    ledger.claim(task_id, owner="other@host:2")
    got["claim (lost: one statement, its event)"] = clock() - started
    started = clock()
    ledger.worker.runs.finish(lease, lease_owner(), Status.SUCCEEDED)
    got["completion"] = clock() - started
    result_id = str(uuid.uuid4())
    started = clock()
    backend.store_result(result_id, 1, "SUCCESS")
    got["django-celery-results store_result"] = clock() - started
    return got


def server_share(ledger: Ledger) -> None:
    """The claim's and the completion's own time in the server (EXPLAIN ANALYZE, rolled
    back): the rest of a statement's time is the round trip and the commit's flush.

    The statements and their parameters are those the store's own ``claim`` and
    ``finish`` send (captured, not sent), so this cannot drift from the library's."""
    from django.db import connections

    from celery_deadlines.rules.states import Status

    connection = connections[ledger.alias]
    unclaimed = ledger.new_run()
    claim = sent_by(ledger.worker, lambda: ledger.claim(unclaimed))
    lease = ledger.claim(ledger.new_run())  # a run claimed, for its completion
    finish = sent_by(
        ledger.worker, lambda: ledger.worker.runs.finish(lease, lease_owner(), Status.SUCCEEDED)
    )
    for name, (statement, params) in (("claim", claim), ("completion", finish)):
        with connection.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {statement}", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            cursor.execute("ROLLBACK")
        planning = _ms(r"Planning Time: ([\d.]+)", plan)
        execution = _ms(r"Execution Time: ([\d.]+)", plan)
        trigger = _ms(r"Trigger celery_deadlines_run_audit: time=([\d.]+)", plan)
        print(
            f"  server side of the {name} (unprepared): planning {planning:.3f} ms, execution "
            f"{execution:.3f} ms (of which the audit trigger {trigger:.3f} ms)"
        )


def sent_by(store: Any, action: Callable[[], Any]) -> tuple[str, Any]:
    """The first statement (and its parameters) ``action`` has ``store`` send, captured
    instead of sent (the action sees no row)."""
    captured: list[tuple[str, Any]] = []

    def capture(statement: str, params: Any, *, timed: bool = False) -> tuple[int, list[Any]]:
        captured.append((statement, params))
        return 0, []

    # a follow-up statement that wanted a row may fail: the first is captured
    with mock.patch.object(store, "execute", capture), contextlib.suppress(Exception):
        action()
    return captured[0]


def _ms(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


def sweeper_plans(ledger: Ledger) -> bool:
    """Print the plans of the sweeper's statements (executed, rolled back); ``True``
    if none reads the run, event or effect table whole."""
    from django.db import connections

    captured: list[tuple[str, Any]] = []

    def capture(statement: str, params: Any, *, timed: bool = False) -> tuple[int, list[Any]]:
        captured.append((statement, params))
        return 0, []

    with mock.patch.object(ledger.worker, "execute", capture):
        sweeper_pass(ledger.worker)
    names = ["expire_unclaimed", "lapsed_leases", "effects.pending", "settled_unknown", "unclaimed"]
    clean = True
    connection = connections[ledger.alias]
    print(f"plans of the sweeper's statements, {runs_in(ledger.alias):,} runs:")
    for name, (statement, params) in zip(names, captured, strict=True):
        with connection.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {statement}", params)
            plan = [row[0] for row in cursor.fetchall()]
            cursor.execute("ROLLBACK")
        seq = [line for line in plan if "Seq Scan" in line and "celery_deadlines_" in line]
        clean = clean and not seq
        print(f"  {name}:")
        for line in plan:
            print(f"    {line}")
    return clean


def compare(small: Ledger, large: Ledger, samples: int) -> float:
    """Time each statement on both sizes, alternating; print the medians; return the
    worst ratio large / small."""
    for _ in range(20):  # warm both (caches, connections)
        sample(small)
        sample(large)
    times: dict[str, dict[str, list[float]]] = {"small": {}, "large": {}}
    for index in range(samples):
        order = [("small", small), ("large", large)]
        if index % 2:
            order.reverse()
        for size, ledger in order:
            for name, seconds in sample(ledger).items():
                times[size].setdefault(name, []).append(seconds)
    small_runs, large_runs = runs_in(small.alias), runs_in(large.alias)
    print(
        f"the ledger at {small_runs:,} and at {large_runs:,} runs ({samples} samples "
        "each, alternating; median ms; commits not waited for, see ledger_settings.py):"
    )
    worst = 0.0
    for name in times["small"]:
        a = statistics.median(times["small"][name])
        b = statistics.median(times["large"][name])
        worst = max(worst, b / a)
        print(f"  {name:14s} {a * 1000:7.3f} {b * 1000:7.3f}   ratio {b / a:.2f}")
    return worst


def console_pages(alias: str) -> dict[str, str]:
    """The admin pages an operator opens, by name -> URL, for the ledger ``alias``: the
    same names at both sizes (a run, a key and a day that exist in both; page 200 exists
    at 10,000 runs). The id prefix ``ended-4711`` matches 1 run at 10^4 and 111 at 10^6:
    a search's cost grows with what it finds, not with the ledger."""
    from celery_deadlines.models import Run

    runs, effects = "/admin/celery_deadlines/run/", "/admin/celery_deadlines/effect/"
    ended = Run.objects.using(alias).filter(task_id__startswith="ended-")
    oldest = ended.order_by("created_at").values_list("created_at", flat=True)[0]
    day = ended.order_by("-created_at").values_list("created_at", flat=True)[0]
    one = Run.objects.using(alias).get(task_id="ended-40")
    # a run the statements' samples made: its id is "bench-" and a UUID's hex, so its
    # first 8 hex are as unique as the short id the list shows of a Celery task id
    uuid_run = Run.objects.using(alias).filter(task_id__startswith="bench-").order_by("id")[0]
    return {
        "run list": runs,
        "page 200": f"{runs}?p=200",
        "search: task name": f"{runs}?q=step_3",
        "search: short id…": f"{runs}?q={uuid_run.task_id[:14]}…",
        "search: id prefix": f"{runs}?q=ended-4711",
        "search: effect key": f"{runs}?q=key-ended-40",
        "filter: status": f"{runs}?status__exact=FAILED",
        "filter: task": f"{runs}?task_name=shop.tasks.step_5",
        "filter: queue": f"{runs}?queue=payments",
        "filter: reason": f"{runs}?reason=retry_budget_exhausted",
        "dates: a month": f"{runs}?created_at__year={day.year}&created_at__month={day.month}",
        "dates: the first month": (
            f"{runs}?created_at__year={oldest.year}&created_at__month={oldest.month}"
        ),
        "dates: a day": (
            f"{runs}?created_at__year={day.year}&created_at__month={day.month}"
            f"&created_at__day={day.day}"
        ),
        "effect list": effects,
        "effects: by name": f"{effects}?name=charge",
        "one run's page": f"{runs}{one.pk}/change/",
    }


def admin_pages(small: Ledger, large: Ledger, samples: int) -> float:
    """Time the console's pages on both sizes (Django's test client, a superuser),
    alternating sample by sample; print each page's medians and their ratio; return
    the worst ratio large / small."""
    from django.contrib.auth.models import User
    from django.test import Client

    from bench.console_urls import LedgerOfTheSize

    user = User.objects.filter(username="bench-operator").first()
    if user is None:
        user = User.objects.create_superuser("bench-operator", password="bench")
    client = Client()
    client.force_login(user)
    urls = {}
    for ledger in (small, large):
        urls[ledger.alias] = console_pages(ledger.alias)

    def page(alias: str, url: str) -> float:
        LedgerOfTheSize.alias = alias
        try:
            started = time.perf_counter()
            response = client.get(url)
            took = time.perf_counter() - started
        finally:
            LedgerOfTheSize.alias = None
        if response.status_code != 200:
            raise RuntimeError(f"{url} on {alias} answered {response.status_code}")
        return took

    names = list(urls[small.alias])
    for _ in range(2):  # warm both (templates, caches, connections)
        for ledger in (small, large):
            for name in names:
                page(ledger.alias, urls[ledger.alias][name])
    times: dict[str, dict[str, list[float]]] = {"small": {}, "large": {}}
    for index in range(samples):
        order = [("small", small), ("large", large)]
        if index % 2:
            order.reverse()
        for size, ledger in order:
            for name in names:
                seconds = page(ledger.alias, urls[ledger.alias][name])
                times[size].setdefault(name, []).append(seconds)
    small_runs, large_runs = runs_in(small.alias), runs_in(large.alias)
    print(
        f"the console's pages at {small_runs:,} and at {large_runs:,} runs ({samples} "
        "samples each, alternating; Django's test client as a superuser; median ms):"
    )
    worst = 0.0
    for name in names:
        a = statistics.median(times["small"][name])
        b = statistics.median(times["large"][name])
        worst = max(worst, b / a)
        print(
            f"  {name:20s} {a * 1000:7.1f} {b * 1000:7.1f}   ratio {b / a:.2f}"
            f"   (large: {min(times['large'][name]) * 1000:.0f}-"
            f"{max(times['large'][name]) * 1000:.0f})"
        )
    return worst
