"""The Celery app of the ledger's integration tests: the Django tier, in real workers.

Workers run ``celery -A tests.support.ledgerapp worker`` with Django set up from
``tests.support.ledger_settings`` (the run ledger on the PostgreSQL test database).
The test process imports the same module with its own Django settings already set up.

Tasks report to an external **sink**: a JSONL file every attempt appends to with
``O_APPEND`` (start, effect), which the tests count as the oracle. It is written by the
task bodies, never read by the library: a duplicate execution shows up as two lines.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.ledger_settings")
django.setup()

from celery import Celery  # noqa: E402
from celery.exceptions import SoftTimeLimitExceeded  # noqa: E402

from celery_deadlines import DeadlineTask  # noqa: E402


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _env_int(name: str) -> int | None:
    return int(os.environ[name]) if name in os.environ else None


def _env_seconds(name: str) -> float | None:
    return float(os.environ[name]) if name in os.environ else None


app = Celery("ledgerapp")
app.conf.update(
    broker_url=os.environ.get("TEST_BROKER_URL", "memory://"),
    result_backend=os.environ.get("TEST_RESULT_BACKEND", "cache+memory://"),
    task_default_queue=os.environ.get("TEST_QUEUE", "celery"),
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    task_acks_late=os.environ.get("TEST_ACKS_LATE") == "1",
    task_reject_on_worker_lost=os.environ.get("TEST_REJECT_ON_WORKER_LOST") == "1",
    broker_transport_options={
        "visibility_timeout": _env_float("TEST_VISIBILITY_TIMEOUT", 3600),
        # kombu sweeps unacked messages every interval x throttle seconds (100 s by
        # default); the redelivery tests need it every second
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
        # Restores hold a Redis lock (kombu's default: one key, 300 s expiry). A worker
        # the crash sweep SIGKILLs inside a restore leaves it held, and no worker on that
        # Redis restores anything for 5 minutes: a later redelivery test then saw none
        # (CI, once). Each test's workers share a lock of their own, briefly held.
        "unacked_mutex_key": f"unacked_mutex:{os.environ.get('TEST_QUEUE', 'celery')}",
        "unacked_mutex_expire": 5,
    },
    deadlines_database=os.environ.get("TEST_LEDGER_DATABASE", "default"),
    deadlines_lease_ttl=_env_float("TEST_LEASE_TTL", 2),
    deadlines_reconcile_interval=_env_float("TEST_RECONCILE_INTERVAL", 0.5),
    deadlines_republish_after=_env_float("TEST_REPUBLISH_AFTER", 60),
    deadlines_max_lost_leases=int(os.environ.get("TEST_MAX_LOST_LEASES", 2)),
    deadlines_clock_skew_allowance=0.1,
    deadlines_clock_skew_budget=(
        _env_float("TEST_CLOCK_SKEW_BUDGET", 0) if "TEST_CLOCK_SKEW_BUDGET" in os.environ else None
    ),
    deadlines_metrics_port=_env_int("TEST_METRICS_PORT"),
    # the refusal for the queue ahead is on by default; TEST_BACKLOG_REFUSAL=0 turns it off
    deadlines_backlog_refusal=os.environ.get("TEST_BACKLOG_REFUSAL") != "0",
    worker_max_tasks_per_child=_env_int("TEST_MAX_TASKS_PER_CHILD"),
    # the project's own app-wide limits (cookiecutter-django sets 300 and 60)
    task_time_limit=_env_seconds("TEST_TASK_TIME_LIMIT"),
    task_soft_time_limit=_env_seconds("TEST_TASK_SOFT_TIME_LIMIT"),
)


def sink(kind: str, key: str, task: DeadlineTask) -> None:
    """Append one line to the oracle file (one write(2) call with O_APPEND)."""
    lease = task.lease
    line = json.dumps(
        {
            "kind": kind,
            "key": key,
            "token": lease.token if lease else None,
            "pid": os.getpid(),
            "t": time.time(),
        }
    )
    fd = os.open(os.environ["TEST_SINK"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@app.task(base=DeadlineTask, bind=True, name="l.effect")
def effect(self: DeadlineTask, key: str, seconds: float = 0.0) -> dict[str, Any]:
    """Work for ``seconds``, pass the dispatch guard (a fenced checkpoint), then act."""
    sink("start", key, self)
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.05)
    self.checkpoint("before-effect", {"key": key})
    sink("effect", key, self)
    lease = self.lease
    return {"key": key, "token": lease.token if lease else None}


@app.task(base=DeadlineTask, bind=True, name="l.other")
def other(self: DeadlineTask, key: str) -> str:
    """Another task than ``l.effect``: a message of it carrying the id of an ``l.effect``
    run must never run (its start would be a line of the sink)."""
    sink("start", key, self)
    return "other's result"


@app.task(base=DeadlineTask, bind=True, name="l.crash_first")
def crash_first(self: DeadlineTask, key: str) -> str:
    """Kill its own pool process on the first attempt; resume from the checkpoint after."""
    sink("start", key, self)
    if self.last_checkpoint is None:
        self.checkpoint("started", {"key": key})
        os.kill(os.getpid(), signal.SIGKILL)
    sink("effect", key, self)
    return key


@app.task(base=DeadlineTask, bind=True, name="l.always_crash")
def always_crash(self: DeadlineTask, key: str) -> None:
    sink("start", key, self)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(base=DeadlineTask, bind=True, name="l.limited", time_limit=1)
def limited(self: DeadlineTask, key: str, seconds: float) -> str:
    """Outlives its own one-second hard time limit."""
    sink("start", key, self)
    time.sleep(seconds)
    sink("effect", key, self)
    return key


@app.task(base=DeadlineTask, bind=True, name="l.stubborn")
def stubborn(self: DeadlineTask, key: str, seconds: float) -> str:
    """Works ``seconds``, and as long again after a soft time limit, which it catches and
    notes (``soft``): only a hard limit stops it."""
    sink("start", key, self)
    try:
        time.sleep(seconds)
    except SoftTimeLimitExceeded:
        sink("soft", key, self)
        time.sleep(seconds)
    sink("effect", key, self)
    return key


@app.task(base=DeadlineTask, bind=True, name="l.soft_stopped", max_retries=1)
def soft_stopped(self: DeadlineTask, key: str, seconds: float) -> str:
    """Works ``seconds``; a soft time limit stops it: its first attempt retries, its
    second fails with it."""
    sink("start", key, self)
    try:
        time.sleep(seconds)
    except SoftTimeLimitExceeded:
        sink("soft", key, self)
        if not self.request.retries:
            raise self.retry(countdown=0) from None
        raise
    return key


def sink_has(key: str) -> bool:
    """The provider's own lookup: did a call for ``key`` arrive? (the oracle file)"""
    path = os.environ["TEST_SINK"]
    if not os.path.exists(path):
        return False
    with open(path) as lines:
        return any(
            entry["kind"] == "effect" and entry["key"] == key
            for entry in map(json.loads, filter(None, lines.read().splitlines()))
        )


@app.task(base=DeadlineTask, bind=True, name="l.pay")
def pay(self: DeadlineTask, key: str, crash: str = "") -> Any:
    """One payment per key. ``crash``: die after the call, before recording it (``after``),
    or after passing the guard, before the call (``before``), on the first attempt only."""
    first = self.lease is not None and self.lease.attempt == 1
    with self.effect("pay", key=key, fingerprint={"key": key}) as fx:
        if fx.completed:
            sink("replayed", key, self)
            return fx.result
        if crash == "before" and first:
            os.kill(os.getpid(), signal.SIGKILL)
        sink("effect", key, self)
        if crash == "after" and first:
            os.kill(os.getpid(), signal.SIGKILL)
        fx.succeed({"paid": key, "token": fx.token})
    return fx.result


@pay.reconciler("pay")
def find_payment(pending: Any) -> Any:
    from celery_deadlines.core.effects import Found, NotFound

    if sink_has(pending.key):
        return Found({"paid": pending.key, "reconciled": True}, evidence="sink lookup: found")
    return NotFound(evidence="sink lookup: no call")


class ProviderRefused(Exception):
    """The provider answered no (here: a fencing-aware provider refused a stale token)."""


def _provider(method: str, key: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{os.environ['TEST_SINK_URL']}/effects/{key}",
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


@app.task(base=DeadlineTask, bind=True, name="l.remote_pay")
def remote_pay(self: DeadlineTask, key: str) -> Any:
    """Pay through the sink process; the first attempt dawdles between guard and call."""
    with self.effect("remote_pay", key=key, fingerprint={"key": key}) as fx:
        if fx.completed:
            return fx.result
        sink("guarded", key, self)  # the guard passed; a test may SIGSTOP us now
        if self.lease is not None and self.lease.attempt == 1:
            time.sleep(1.5)
        body = {"token": fx.token, "fence": fx.fence, "pid": os.getpid()}
        status, answer = _provider("POST", key, body)
        if status == 409:
            fx.fail(f"provider refused: {answer}")
            raise ProviderRefused(answer)
        fx.succeed(answer)
    return fx.result


@remote_pay.reconciler("remote_pay")
def find_remote_payment(pending: Any) -> Any:
    from celery_deadlines.core.effects import Found, NotFound

    # the lookup is fenced: the dispatch asked about can no longer land after it
    status, answer = _provider("GET", f"{pending.key}?fence={pending.fence}")
    if status == 200:
        return Found(
            answer["calls"][-1], evidence=f"provider lookup: {len(answer['calls'])} call(s)"
        )
    return NotFound(evidence="provider lookup: no call")


@app.task(base=DeadlineTask, bind=True, name="l.slow_pay", reconcilers={"pay": find_payment})
def slow_pay(self: DeadlineTask, key: str) -> None:
    """The provider takes the payment, then hangs past the deadline (seed 004)."""
    with self.effect("pay", key=key, fingerprint={"key": key}):
        sink("effect", key, self)
        time.sleep(30)


@app.task(
    base=DeadlineTask, bind=True, name="l.sweep_pay", reconcilers={"pay": find_remote_payment}
)
def sweep_pay(self: DeadlineTask, key: str, retry_first: bool = False) -> Any:
    """One payment per key through the provider process; the crash-point sweep's task.

    ``retry_first``: the first delivery retries before paying (for the retry's points).
    """
    if retry_first and not self.request.retries:
        raise self.retry(countdown=0.2)
    return _pay_once(self, "pay", key)


def _pay_once(task: DeadlineTask, name: str, key: str) -> Any:
    """One provider call for ``key`` under the effect ledger (replayed if already done)."""
    with task.effect(name, key=key, fingerprint={"key": key}) as fx:
        if fx.completed:
            return fx.result
        body = {
            "token": fx.token, "fence": fx.fence, "pid": os.getpid(),
            "task_id": task.request.id,
        }  # fmt: skip
        status, answer = _provider("POST", key, body)
        if status != 200:
            fx.fail(f"provider answered {status}: {answer}")
            raise ProviderRefused(answer)
        fx.succeed(answer)
    return fx.result


@app.task(base=DeadlineTask, bind=True, name="l.order", reconcilers={"pay": find_remote_payment})
def order(self: DeadlineTask, order_id: str, notify_id: str, countdown: float) -> Any:
    """The business action (one payment), then its completion notice, sent ``countdown``
    seconds later: a delivery, governed by the order's delivery deadline (seed 004)."""
    paid = _pay_once(self, "pay", f"{order_id}:pay:v1")
    notify.apply_async((order_id,), task_id=notify_id, countdown=countdown)
    return paid


@app.task(
    base=DeadlineTask, bind=True, name="l.notify", deadline_kind="delivery",
    reconcilers={"notice": find_remote_payment},
)  # fmt: skip
def notify(self: DeadlineTask, order_id: str) -> Any:
    """The completion notice: its own effect key, so it never re-runs the payment."""
    return _pay_once(self, "notice", f"{order_id}:completion:v1")


@app.task(base=DeadlineTask, bind=True, name="l.ambiguous_pay")
def ambiguous_pay(self: DeadlineTask, key: str) -> Any:
    """Pays, then loses the provider's reply (a timeout): the outcome is UNKNOWN, and the
    task has no reconciler, so it stays UNKNOWN until an operator resolves it."""
    with self.effect("pay", key=key, fingerprint={"key": key}) as fx:
        if fx.completed:
            sink("replayed", key, self)
            return fx.result
        sink("effect", key, self)
        raise TimeoutError("the provider's reply timed out")


@app.task(base=DeadlineTask, bind=True, name="l.report")
def report(self: DeadlineTask) -> str:
    """A scheduled report: one effect line per run, keyed by the occurrence's run id."""
    sink("effect", str(self.request.id), self)
    return str(self.request.id)


if os.environ.get("TEST_BEAT_AT"):
    # ``celery beat -S celery_deadlines.beat:DeadlineScheduler`` runs this entry daily at
    # TEST_BEAT_AT (local wall time in TEST_BEAT_ZONE), with TEST_BEAT_WINDOW seconds
    from datetime import time as wall_time
    from datetime import timedelta

    from celery_deadlines.beat import ZonedSchedule
    from celery_deadlines.rules.schedules import LocalSchedule

    app.conf.beat_schedule = {
        "report": {
            "task": "l.report",
            "schedule": ZonedSchedule(
                LocalSchedule(
                    wall_time.fromisoformat(os.environ["TEST_BEAT_AT"]),
                    os.environ.get("TEST_BEAT_ZONE", "Europe/Berlin"),
                    timedelta(seconds=_env_float("TEST_BEAT_WINDOW", 60)),
                    name=os.environ.get("TEST_BEAT_NAME", "report"),
                )
            ),
        }
    }


@app.task(base=DeadlineTask, bind=True, name="l.fan_out")
def fan_out(self: DeadlineTask, key: str, members: int) -> list[str]:
    """A root that starts a long-running watcher, then a group of ``members`` effects
    (queued behind the watcher on a worker of one process): the ids it started."""
    from celery import group
    from celery.result import GroupResult

    watcher = watch_remaining.delay(f"{key}-watch")
    started = group(effect.s(f"{key}-{n}") for n in range(members)).apply_async()
    assert isinstance(started, GroupResult)
    return [watcher.id, *(result.id for result in started.results)]


@app.task(base=DeadlineTask, bind=True, name="l.watch_remaining")
def watch_remaining(self: DeadlineTask, key: str, seconds: float = 30.0) -> str:
    """Loop on ``remaining()`` until it reaches 0 (a sink line ``remaining-zero``) or
    ``seconds`` pass (``gave-up``); then try an effect (``effect`` when it is
    dispatched, else the name of the error that refused it) and publish a child
    (``child-refused`` when the enqueue gate refuses it, ``child-published`` when not)."""
    from celery_deadlines import DeadlineRefused, DispatchRefused, StaleLease

    sink("start", key, self)
    until = time.monotonic() + seconds
    while self.remaining() > 0 and time.monotonic() < until:
        time.sleep(0.02)
    sink("remaining-zero" if self.remaining() <= 0 else "gave-up", key, self)
    try:
        with self.effect("notify", key=f"{key}-after", fingerprint={"key": key}) as fx:
            sink("effect", key, self)
            fx.succeed({"notified": key})
    except (DispatchRefused, StaleLease) as refused:
        sink(f"effect-refused:{type(refused).__name__}", key, self)
    try:
        effect.delay(f"{key}-late-child")
    except DeadlineRefused:
        sink("child-refused", key, self)
    else:
        sink("child-published", key, self)
    return "saw zero"


@app.task(base=DeadlineTask, bind=True, name="l.checkout_tree")
def checkout_tree(self: DeadlineTask, key: str, members: int) -> dict[str, Any]:
    """A checkout's root: a provider call of its own (``<key>-reserve``), then a
    long-running watcher (``l.watch_and_pay``), a chain of two provider calls and a
    group of ``members`` provider calls (``l.provider_step``), queued behind the
    watcher on a worker of one process. The ids it started."""
    from celery import chain, group
    from celery.result import GroupResult

    _pay_once(self, "reserve", f"{key}-reserve")

    watcher = watch_and_pay.delay(f"{key}-watch")
    chained = chain(provider_step.si(f"{key}-chain-0"), provider_step.si(f"{key}-chain-1"))
    last = chained.apply_async()
    started = group(provider_step.si(f"{key}-{n}") for n in range(members)).apply_async()
    assert isinstance(started, GroupResult)
    return {
        "watcher": watcher.id,
        "chain": [last.parent.id, last.id],
        "group": [result.id for result in started.results],
    }


@app.task(base=DeadlineTask, bind=True, name="l.provider_step")
def provider_step(self: DeadlineTask, key: str) -> Any:
    """One provider call for ``key`` under the effect ledger (the provider logs it)."""
    sink("start", key, self)
    return _pay_once(self, "step", key)


@app.task(base=DeadlineTask, bind=True, name="l.watch_and_pay")
def watch_and_pay(self: DeadlineTask, key: str, seconds: float = 30.0) -> str:
    """Loop on ``remaining()`` until it reaches 0 (a sink line ``remaining-zero``) or
    ``seconds`` pass (``gave-up``); then query the database (``query-cut`` when the
    cap cuts it, ``query-ran`` when not), try a provider call (``paid``, or the name of
    the error that refused it) and publish a child (``child-refused`` when the enqueue
    gate refuses it, ``child-published`` when not)."""
    from django.db import connection

    from celery_deadlines import DeadlineRefused, DispatchRefused, QueryCut, StaleLease

    sink("start", key, self)
    until = time.monotonic() + seconds
    while self.remaining() > 0 and time.monotonic() < until:
        time.sleep(0.02)
    sink("remaining-zero" if self.remaining() <= 0 else "gave-up", key, self)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        sink("query-ran", key, self)
    except QueryCut:
        sink("query-cut", key, self)
    try:
        _pay_once(self, "pay", f"{key}-after")
        sink("paid", key, self)
    except (DispatchRefused, StaleLease) as refused:
        sink(f"pay-refused:{type(refused).__name__}", key, self)
    try:
        provider_step.delay(f"{key}-late-child")
    except DeadlineRefused:
        sink("child-refused", key, self)
    else:
        sink("child-published", key, self)
    return "saw zero"


@app.task(base=DeadlineTask, bind=True, name="l.terminable", cancel_terminates=True)
def terminable(self: DeadlineTask, key: str, seconds: float = 30.0) -> str:
    """A body that never looks at ``remaining()`` (it works in short steps for
    ``seconds``: ``gave-up``), whose task declares that a cancel terminates it: its
    ``finally`` writes ``terminated:<the exception's name>``."""
    return _work_without_looking(self, key, seconds, stopped_as="terminated")


@app.task(base=DeadlineTask, bind=True, name="l.never_looks")
def never_looks(self: DeadlineTask, key: str, seconds: float = 60.0) -> str:
    """A body that never looks at ``remaining()`` (it works in short steps for
    ``seconds``: ``gave-up``), whose task does not declare ``cancel_terminates``: a
    cancel ends it only by its fallen hard limit (``stopped:<name>`` where the pool
    raises one in it: a green pool's ``Timeout``; prefork's process is killed)."""
    return _work_without_looking(self, key, seconds, stopped_as="stopped")


def _work_without_looking(task: DeadlineTask, key: str, seconds: float, stopped_as: str) -> str:
    """Work in short steps for ``seconds`` (``gave-up``) without looking at
    ``remaining()``; an exception that stops it is noted ``<stopped_as>:<its name>``."""
    sink("start", key, task)
    try:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            time.sleep(0.02)
        sink("gave-up", key, task)
    except BaseException as stopped:
        sink(f"{stopped_as}:{type(stopped).__name__}", key, task)
        raise
    return "ran to its end"


@app.task(base=DeadlineTask, bind=True, name="l.terminable_in_effect", cancel_terminates=True)
def terminable_in_effect(self: DeadlineTask, key: str, seconds: float = 30.0) -> str:
    """A body cancelled in the middle of an effect's dispatch (its guard passed, then it
    waits until ``remaining()`` reaches 0, the cancel learnt, before it calls the
    provider), whose task declares that a cancel terminates it: ``dispatching``,
    ``called``, then ``terminated:<name>`` after the effect's outcome, never
    ``after-effect``."""
    sink("start", key, self)
    try:
        with self.effect("pay", key=key, fingerprint={"key": key}) as fx:
            sink("dispatching", key, self)
            until = time.monotonic() + seconds
            while self.remaining() > 0 and time.monotonic() < until:
                time.sleep(0.02)
            body = {"token": fx.token, "fence": fx.fence, "pid": os.getpid()}
            _, answer = _provider("POST", key, body)
            sink("called", key, self)
            fx.succeed(answer)
        sink("after-effect", key, self)
    except BaseException as stopped:
        sink(f"terminated:{type(stopped).__name__}", key, self)
        raise
    return "ran to its end"


@app.task(base=DeadlineTask, bind=True, name="l.busy_tree")
def busy_tree(self: DeadlineTask, key: str, members: int) -> dict[str, Any]:
    """A root that starts a body a cancel terminates (``l.terminable``), then
    ``members`` provider calls queued behind it on a worker of one process."""
    busy = terminable.delay(f"{key}-busy")
    queued = [provider_step.delay(f"{key}-{n}") for n in range(members)]
    return {"busy": busy.id, "queued": [result.id for result in queued]}
