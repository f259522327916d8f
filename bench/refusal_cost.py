"""What one refusal costs a prefork worker's main process: DeadlineTask vs Celery's own
``expires``, in Python alone (a memory broker and result backend: no round trip).

Each sample is a fresh interpreter that publishes ``--messages`` messages already past
their deadline (a DeadlineTask with a 1 ms budget) or their expiry (a plain task with
``expires``), and hands each one to the task's strategy as a worker's consumer does; the
gate refuses it (the failure stored, the message acknowledged) before any pool sees it.
The two alternate sample by sample; the medians of ``--samples`` and their ratio are
printed. ``--profile`` prints where one sample of the DeadlineTask's refusals goes.

Usage: python bench/refusal_cost.py [--messages 3000] [--samples 6] [--profile]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

LOOP = r"""
import cProfile, logging, pstats, sys, time
from types import SimpleNamespace

from celery import Celery, Task
from celery.exceptions import TaskRevokedError
from celery.worker import state as worker_state

from celery_deadlines import DeadlineTask

app = Celery("refusals", broker="memory://", backend="cache+memory://", set_as_current=True)
app.conf.update(task_serializer="json", accept_content=["json"])


def identity(x):
    return x


app.task(base=DeadlineTask, name="m.deadline", shared=False, budget=0.001)(identity)
app.task(base=Task, name="m.plain", shared=False)(identity)
app.finalize(auto=True)
task = app.tasks[sys.argv[2]]
count, warm = int(sys.argv[1]), 50
options = {"expires": 0.001} if task.name == "m.plain" else {}
connection = app.connection_for_write()
queue = connection.SimpleQueue("refusals")
producer = app.amqp.Producer(connection)
for i in range(warm + count):
    task.apply_async((i,), producer=producer, queue="refusals", **options)
messages = [queue.get(block=False) for _ in range(warm + count)]
time.sleep(0.05)  # every one past its deadline or expiry
for name in ("celery_deadlines", "celery"):
    logging.getLogger(name).addHandler(logging.NullHandler())
    logging.getLogger(name).propagate = False


class Pool:
    def apply_async(self, *args, **kwargs):
        raise AssertionError("a refused message reached the pool")


def process(request):
    # as the worker's WorkController._process_task: a revoked request's error ends there
    try:
        request.execute_using_pool(Pool())
    except TaskRevokedError:
        pass


consumer = SimpleNamespace(
    hostname="bench@worker", connection_errors=(), event_dispatcher=None,
    timer=SimpleNamespace(call_at=None), apply_eta_task=None, disable_rate_limits=True,
    task_buckets={}, on_task_request=process,
    _limit_task=None, _limit_post_eta=None, controller=SimpleNamespace(state=worker_state),
    pool=Pool(),
)
handler = task.start_strategy(app, consumer)


def run(message):
    handler(message, None, message.ack_log_error, message.reject_log_error, [])


for message in messages[:warm]:
    run(message)
profile = cProfile.Profile() if sys.argv[3] == "profile" else None
started = time.perf_counter()
if profile:
    profile.enable()
for message in messages[warm:]:
    run(message)
if profile:
    profile.disable()
    pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
print((time.perf_counter() - started) / count)
"""


def sample(task: str, messages: int, profile: bool = False) -> float:
    out = subprocess.run(
        [sys.executable, "-c", LOOP, str(messages), task, "profile" if profile else "-"],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    if profile:
        print(out.stdout)
    return float(out.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    times: dict[str, list[float]] = {"m.plain": [], "m.deadline": []}
    for index in range(args.samples):
        order = list(times) if index % 2 == 0 else list(times)[::-1]
        for task in order:
            times[task].append(sample(task, args.messages))
    plain, deadline = (statistics.median(times[t]) for t in ("m.plain", "m.deadline"))
    print(
        f"a refusal in the main process ({args.samples} samples of {args.messages}, "
        f"median): Celery's expires {plain * 1e6:.0f} us, DeadlineTask {deadline * 1e6:.0f} "
        f"us, ratio {deadline / plain:.2f}"
    )
    if args.profile:
        sample("m.deadline", args.messages, profile=True)


if __name__ == "__main__":
    main()
