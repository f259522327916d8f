"""The Celery app of the tests beside Flower and django-celery-results (DCR).

Workers run ``celery -A tests.support.flowerapp worker`` and Flower runs ``celery -A
tests.support.flowerapp flower``, with Django set up from
:mod:`tests.support.flower_settings` (the run ledger on the PostgreSQL test database,
and DCR's table beside it). As those tools' users configure Celery: the extended
results (``result_extended``: a result names its task, arguments, worker and queue)
and task events (``worker_send_task_events``, what ``celery worker -E`` turns on). The
result backend is Redis or DCR's ``django-db`` (``TEST_RESULT_BACKEND``).
"""

from __future__ import annotations

import os
import signal
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.flower_settings")
django.setup()

from celery import Celery  # noqa: E402

from celery_deadlines import DeadlineTask  # noqa: E402


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


app = Celery("flowerapp")
app.conf.update(
    broker_url=os.environ.get("TEST_BROKER_URL", "memory://"),
    result_backend=os.environ.get("TEST_RESULT_BACKEND", "cache+memory://"),
    task_default_queue=os.environ.get("TEST_QUEUE", "celery"),
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_extended=True,
    worker_send_task_events=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    deadlines_database=os.environ.get("TEST_LEDGER_DATABASE", "default"),
    deadlines_lease_ttl=_env_float("TEST_LEASE_TTL", 2),
    deadlines_reconcile_interval=_env_float("TEST_RECONCILE_INTERVAL", 1),
    deadlines_republish_after=60,
    deadlines_clock_skew_allowance=0.1,
)


@app.task(name="f.nap")
def nap(seconds: float) -> float:
    """A plain Celery task that keeps a pool process busy for ``seconds``."""
    time.sleep(seconds)
    return seconds


@app.task(base=DeadlineTask, bind=True, name="f.step")
def step(self: DeadlineTask, number: int, note: str = "") -> int:
    """A DeadlineTask with nothing to do: the run under test waits for a free process."""
    return number


@app.task(base=DeadlineTask, bind=True, name="f.pay_then_die")
def pay_then_die(self: DeadlineTask, key: str) -> None:
    """Pass the dispatch guard, make the call, then lose the pool process before its
    outcome is recorded: the run is UNKNOWN, and with no reconciler for ``pay`` it
    stays UNKNOWN until an operator resolves it."""
    with self.effect("pay", key=key, fingerprint={"key": key}):
        os.kill(os.getpid(), signal.SIGKILL)


@app.task(base=DeadlineTask, bind=True, name="f.pay_reply_lost")
def pay_reply_lost(self: DeadlineTask, key: str) -> None:
    """Make the call, then lose the provider's reply (a timeout): the attempt ends the
    run UNKNOWN itself; no reconciler for ``pay``, so it stays UNKNOWN."""
    with self.effect("pay", key=key, fingerprint={"key": key}):
        raise TimeoutError("the provider's reply timed out")
