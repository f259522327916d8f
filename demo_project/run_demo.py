"""``make demo``: run the shop story on real worker processes and explain every task.

1. start the shop worker (prefork) on the configured broker (default: the embedded
   SQLite + kombu filesystem transport, no server);
2. place order 42 through the shop's checkout view (Django's test client): the view's
   8 s budget is the request's deadline, and the order's tasks inherit it; a gift-wrap
   chain that cannot fit in the same budget is refused whole at enqueue, with its
   arithmetic; the warehouse worker is "down" for 5 s;
3. try to place order 43 with a deadline already past: refused at enqueue;
4. start the warehouse worker, wait for every task to finish, print what happened
   to each and why (deadline, time left, gate decision), and stop the workers;
5. the address change: the customer confirms a new address for order 42; the
   first attempt plans the change and finds the fulfillment service unavailable; while
   the worker is down the order moves to the locked warehouse queue; the resumed plan
   is refused with a reason the user can read, and the address is left alone.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402
from kombu.utils.url import maybe_sanitize_url  # noqa: E402

from celery_deadlines import DeadlineRefused, PlanRefused  # noqa: E402
from celery_deadlines.models import Run, RunPlan  # noqa: E402
from demo_project.celery import app  # noqa: E402
from demo_project.shop import fulfillment, provider  # noqa: E402
from demo_project.shop.tasks import ADDRESS_RETRY_IN, change_address, place_order  # noqa: E402
from demo_project.shop.views import CHECKOUT_BUDGET  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
WAREHOUSE_DOWN_FOR = 5.0


def purge_queues(*names: str) -> None:
    with app.connection_for_write() as connection:
        channel: Any = connection.default_channel
        for name in names:
            try:
                channel.queue_purge(name)
            except Exception:  # noqa: BLE001 - a queue that does not exist yet is empty
                connection.close()
                channel = connection.default_channel


def start_worker(queue: str, log: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "celery", "-A", "demo_project", "worker", "-P", "prefork",
        "-c", "2", "-Q", queue, "-n", f"{queue}@%h", "-l", "INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    wait_until(lambda: " ready." in log.read_text(errors="replace"), 60, f"{queue} worker")
    return process


def stop_worker(process: subprocess.Popen[bytes]) -> None:
    """Warm shutdown (SIGTERM to the main process: tasks in progress finish first)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def wait_until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: gave up waiting for {what} after {timeout:.0f} s")
        time.sleep(0.1)
    return value


def outcome(task_id: str) -> dict[str, Any]:
    result = app.AsyncResult(task_id)
    try:
        value = result.get(timeout=0.5, propagate=True, disable_sync_subtasks=False)
    except DeadlineRefused as refused:
        return {"state": result.state, "refusal": refused}
    except Exception as exc:  # noqa: BLE001 - the demo explains failures, it does not hide them
        return {"state": result.state, "error": exc}
    return {"state": result.state, "value": value}


def order_deadline(task_id: str) -> str:
    """The deadline the order ran under, as the order task itself reported it."""
    value: dict[str, Any] = app.AsyncResult(task_id).get(timeout=30)
    deadline: str = value["deadline"]
    return deadline


def finished(task_id: str) -> bool:
    return app.AsyncResult(task_id).ready()


def clock(instant: str | datetime | None) -> str:
    if instant is None:
        return "-"
    moment = datetime.fromisoformat(instant) if isinstance(instant, str) else instant
    return moment.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3] + "Z"


def explain(name: str, task_id: str) -> list[str]:
    seen = outcome(task_id)
    if "refusal" in seen:
        refused: DeadlineRefused = seen["refusal"]
        lines = [
            # the ledger's word for the run (docs/explanation/run-ledger.md: one word per situation)
            f"{name:<15} {run_status(task_id)} at the {refused.gate} gate: {refused.reason}",
            f"{'':<15} deadline {clock(refused.deadline)}, clock read "
            f"{clock(refused.clock_reading)}",
            f"{'':<15} {refused.detail}",
        ]
    elif "error" in seen:
        lines = [f"{name:<15} {seen['state']}: {seen['error']!r}"]
    else:
        value = seen["value"]
        lines = [
            f"{name:<15} SUCCEEDED, started with {value['time_left_at_start']:.2f} s left",
            f"{'':<15} deadline {clock(value['deadline'])} (from the {value['source']}), "
            f"attempt {value['attempt']}",
        ]
        if "charge" in value:
            key = value["charge"]["key"]
            how = "replayed after reconciling a lost reply" if value["replayed"] else "direct"
            lines.append(
                f"{'':<15} provider charges for {key}: {len(provider.charges(key))} ({how})"
            )
    return [*lines, f"{'':<15} {ledger_line(task_id)}"]


def ledger_line(task_id: str) -> str:
    """What the run ledger says (the admin shows the same, with the event timeline)."""
    run = Run.objects.filter(task_id=task_id).first()
    if run is None:
        return "ledger: no run recorded"
    reason = f" ({run.reason})" if run.reason else ""
    owner = run.owner or "nobody"
    return (
        f"ledger: {run.status}{reason}, {run.attempt} claim(s), fencing token "
        f"{run.lease_token}, last owner {owner}, {run.events.count()} events"
    )


def forget_the_last_story() -> None:
    """A rerun tells the same story: the story's fixed run ids and effect keys (order-43,
    order-42:capture:v1, ...) must not meet the last run's, which the ledger would rightly
    treat as the same runs. The demo's own database only: its runs and their results."""
    from django_celery_results.models import TaskResult

    Run.objects.all().delete()  # with their events, effects and plans
    TaskResult.objects.all().delete()


def main() -> None:
    logging.basicConfig(
        stream=sys.stdout, level=logging.WARNING, format="  [log] %(name)s: %(message)s"
    )
    logging.getLogger("kombu").setLevel(logging.ERROR)  # "No hostname was supplied" on fs://
    logging.getLogger("django.request").setLevel(logging.ERROR)  # the gift wrap's 503 is told
    var = Path(settings.VAR_DIR)
    shutil.rmtree(var / "broker", ignore_errors=True)
    for folder in ("queue", "processed", "control"):
        (var / "broker" / folder).mkdir(parents=True, exist_ok=True)
    call_command("migrate", verbosity=0)
    forget_the_last_story()
    (var / "provider.jsonl").unlink(missing_ok=True)  # a rerun starts with no charges
    # a rerun must not meet the last run's messages
    purge_queues(
        settings.CELERY_TASK_DEFAULT_QUEUE,
        settings.DEMO_WAREHOUSE_QUEUE,
        settings.DEMO_ADDRESS_QUEUE,
    )
    database = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    broker = settings.CELERY_BROKER_URL
    if "@" in broker:  # credentials: print the URL with its password masked
        broker = maybe_sanitize_url(broker)
    print(f"celery-deadlines demo: broker {broker}, database {database}")

    shop = start_worker(settings.CELERY_TASK_DEFAULT_QUEUE, var / "shop-worker.log")
    warehouse = None
    try:
        browser = Client()
        response = browser.post("/orders/42/checkout/")
        order = place_order.AsyncResult(response.json()["order"])
        print(
            f"\nPOST /orders/42/checkout/ -> {response.status_code}: the view's "
            f"{CHECKOUT_BUDGET:.0f} s budget (@deadline_budget) is the request's deadline, "
            f"{clock(order_deadline(order.id))}; place_order, published by the view, inherits "
            f"it ({response['X-Deadline-Remaining-Ms']} ms were left when the page was ready); "
            "print_label has its own 3 s budget (CELERY_DEADLINES_BUDGETS)"
        )
        wrapped = browser.post("/orders/42/gift-wrap/")
        print(
            f"POST /orders/42/gift-wrap/ -> {wrapped.status_code}: the chain "
            f"wrap_gift -> engrave_card is refused at enqueue, nothing published: "
            f"{wrapped.json()['refused']}: {wrapped.json()['detail']}"
        )
        try:
            place_order.apply_async(
                (43,), deadline=datetime.now(UTC) - timedelta(seconds=1), task_id="order-43"
            )
        except DeadlineRefused as refused:
            print(f"order 43 placed with a deadline 1 s ago -> refused at once: {refused}")
            print(f"{'':<15} {ledger_line('order-43')}")
        print(f"the warehouse worker is down for {WAREHOUSE_DOWN_FOR:.0f} s ...", flush=True)
        children = wait_until(lambda: finished(order.id) and order.get()["children"], 30, "order")
        time.sleep(WAREHOUSE_DOWN_FOR)
        warehouse = start_worker(settings.DEMO_WAREHOUSE_QUEUE, var / "warehouse-worker.log")
        ids = {"place_order": order.id, **children}
        wait_until(lambda: all(finished(i) for i in ids.values()), 60, "all tasks")
        print("\nwhat happened, and why:")
        for name, task_id in ids.items():
            print("\n".join(explain(name, task_id)))
        address_change_story(var)
        print(
            f"\nworker logs: {var / 'shop-worker.log'}, {var / 'warehouse-worker.log'}, "
            f"{var / 'address-worker.log'}"
        )
    finally:
        stop_worker(shop)
        if warehouse is not None:
            stop_worker(warehouse)


def address_change_story(var: Path) -> None:
    """The address change, end to end: a resumed plan is checked against the world first."""
    print("\nthe address change:")
    fulfillment.reset(42, available=False)
    log = var / "address-worker.log"
    worker = start_worker(settings.DEMO_ADDRESS_QUEUE, log)
    try:
        change_address.apply_async(
            (42, "Hauptstr. 5, Berlin"), queue=settings.DEMO_ADDRESS_QUEUE, task_id="address-42"
        )
        wait_until(lambda: app.AsyncResult("address-42").state == "RETRY", 30, "the first attempt")
        print(
            "attempt 1: planned the change from the confirmed request (order open); the "
            f"fulfillment service is unavailable -> retry in {ADDRESS_RETRY_IN:.0f} s"
        )
        stop_worker(worker)
        fulfillment.move_to_warehouse(42)
        print("the worker is down; meanwhile order 42 moves to the locked warehouse queue")
        worker = start_worker(settings.DEMO_ADDRESS_QUEUE, var / "address-worker-2.log")
        wait_until(
            lambda: (
                run_status("address-42") in ("SUCCEEDED", "FAILED", "EXPIRED")
                and finished("address-42")
            ),
            90,
            "the resumed address change",
        )
    finally:
        stop_worker(worker)
    try:
        app.AsyncResult("address-42").get(timeout=1, disable_sync_subtasks=False)
        print("change_address SUCCEEDED (the plan still applied)")
    except PlanRefused as refused:
        print(f"change_address {run_status('address-42')} on resume: {refused.reason}")
        print(f"{'':<15} {refused.detail}")
    plans = RunPlan.objects.filter(run__task_id="address-42").order_by("id")
    for plan in plans:
        print(f"{'':<15} plan {plan.plan_id}: {plan.state} {plan.reason}".rstrip())
    print(f"{'':<15} {ledger_line('address-42')}")
    print(f"{'':<15} the order's address is still {fulfillment.address_of(42)!r}")


def run_status(task_id: str) -> str | None:
    run = Run.objects.filter(task_id=task_id).first()
    return run.status if run is not None else None


if __name__ == "__main__":
    main()
