"""The ledger benchmark's app: what users already pay for tracking, and the ledger.

* ``bench.tracked``: a plain task whose result django-celery-results stores in
  PostgreSQL (the baseline: the tracking a Django shop already has);
* ``bench.ledgered``: a DeadlineTask recorded by the run ledger (outbox row, claim,
  completion) in the same database, with no result backend write.
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.ledger_settings")
django.setup()

from celery import Celery, Task  # noqa: E402

from celery_deadlines import DeadlineTask  # noqa: E402

app = Celery("ledgerbench")
app.conf.update(
    broker_url=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/12"),
    result_backend="django-db",
    task_serializer="json",
    accept_content=["json"],
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    task_default_queue=os.environ.get("BENCH_QUEUE", "bench"),
    worker_prefetch_multiplier=4,
)
if os.environ.get("BENCH_DB_REUSE_MAX"):
    # Celery's Django fixup closes Django's connections before and after every task
    # unless this (old-style) key is set; the benchmark measures both ways
    app.conf["CELERY_DB_REUSE_MAX"] = int(os.environ["BENCH_DB_REUSE_MAX"])


if os.environ.get("BENCH_ROUND_TRIPS"):
    # the counted worker of bench/ledger.py (``-P solo``, not timed): every statement
    # this process sends and has answered, written after each task for the bench to read
    from celery.signals import task_postrun

    from bench.claims import count_round_trips

    _trips = count_round_trips()
    _tally = os.environ["BENCH_ROUND_TRIPS"]

    @task_postrun.connect(weak=False)
    def _write_tally(**_: object) -> None:
        # written whole, then renamed: a reader never finds it empty or half written
        with open(f"{_tally}.part", "w") as out:
            out.write(str(_trips[0]))
        os.replace(f"{_tally}.part", _tally)


@app.task(base=Task, name="bench.tracked")
def tracked(x: int) -> int:
    return x


@app.task(base=DeadlineTask, name="bench.ledgered", budget=300, ignore_result=True)
def ledgered(x: int) -> int:
    return x
