"""A publish's and a worker's cost per message counted in CPU instructions, not seconds.

The worker-side twin of ``bench/publish_instructions.py``: wall-clock figures on a
shared 2-core machine move by 10-30 % from run to run, valgrind's callgrind counts
instructions, which repeat to a fraction of a percent. Messages are published for real
(memory transport) by a plain Celery task, a ``DeadlineTask`` with a budget and one with
none, then run through the code a prefork worker runs for each:

* ``publish``: the whole ``apply_async`` of each variant, Celery's and kombu's code
  included (the memory transport's queue stands for the broker), for the cost a
  caller pays per publish: the library's own code and what it makes Celery do;
* ``main``: the main process. Celery's own strategy (``task_message_handler``: the
  request, ``revoked()`` when the message has ``expires``, ``task_reserved``), the
  request's ``execute_using_pool`` (the claim gate, the time-limit cap) into a pool that
  does what billiard's ``AsynPool`` does around a job: the accept callback, the job's
  time-limit handlers when it starts and ends (a plain task: Celery's own, a timer per
  job that has a limit; a DeadlineTask: the package's ``JobLimits``, which a worker with
  the package installed gives every pool) and the success callback (acknowledge,
  ``task_ready``);
* ``child``: the pool process. Celery's tracer on the request (``before_start``, the
  body, ``__call__``), as ``fast_trace_task`` runs it.

Broker I/O, pipes and pickling are left out: they are the same for every variant. The
heap built by the imports is frozen (``gc.freeze``) before counting: without it, an
unused 300-function module added to the package moved the main process's count of a
DeadlineTask message by 2.4 %, the cyclic collector visiting more module objects. Only the
processing of ``--messages`` messages is counted (after 200 warm-up ones): callgrind
collects inside one ``functools.reduce`` call that runs them, and nothing else.
``--against PATH`` counts another source tree too (a ``git worktree`` of an older commit),
its ratios against the plain task counted with it; each tree is imported through a
path of one length.

Usage: python bench/worker_instructions.py [--messages 2000] [--against ../old-tree]
Needs valgrind (Debian package ``valgrind``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.callgrind import collected  # noqa: E402

#: The measured loop, run in a fresh interpreter with the source tree first on the path.
LOOP = """
import sys
sys.path.insert(0, sys.argv[1])
import functools
import gc
import time
import weakref
from types import SimpleNamespace

from celery import Celery, Task
from celery.app.trace import build_tracer, fast_trace_task
from celery.worker import state as worker_state
from kombu.asynchronous import Hub

from celery_deadlines import DeadlineTask

app = Celery("bench-worker", broker="memory://", set_as_current=True)
app.conf.update(task_ignore_result=True, task_serializer="json", accept_content=["json"])


def identity(x):
    return x


app.task(base=Task, name="m.plain", shared=False)(identity)
app.task(base=DeadlineTask, name="m.deadline", shared=False, budget=300)(identity)
app.task(base=DeadlineTask, name="m.nobudget", shared=False, budget=None)(identity)
app.finalize(auto=True)
task = app.tasks[sys.argv[3]]
side = sys.argv[4]
count = int(sys.argv[2])

connection = app.connection_for_write()
queue = connection.SimpleQueue("bench-worker")
producer = app.amqp.Producer(connection)


def publish(i):
    task.apply_async((i,), producer=producer, queue="bench-worker")


# The heap the imports built is frozen before counting (gc.freeze, as a preloading
# server does before it forks): the cyclic collector's visits to module objects, whose
# number any unrelated module changes, are not the messages' cost.
if side == "publish":
    for i in range(200):  # warm-up, not counted
        publish(i)
    gc.collect()
    gc.freeze()
    functools.reduce(lambda _, i: publish(i), range(count), None)
    raise SystemExit(0)
for i in range(200 + count):
    publish(i)
messages = [queue.get(block=False) for _ in range(200 + count)]

hub = Hub()
trefs = weakref.WeakValueDictionary()


class Pool:
    # what billiard's AsynPool does in the main process around one job: the accept
    # callback, the job's time-limit handlers when a pool process starts it and when it
    # ends, the success callback. A plain worker's handlers are Celery's own (a timer per
    # job that has a limit); a worker with this package installed uses its JobLimits
    # (celery_deadlines.core.timelimits, patched into every AsynPool by worker_init).
    def apply_async(self, target, args, accept_callback, timeout_callback, callback,
                    error_callback, soft_timeout, timeout, correlation_id):
        accept_callback(1234, time.monotonic())
        result = SimpleNamespace(_job=correlation_id)
        self.on_timeout_set(result, soft_timeout, timeout)
        self.on_timeout_cancel(result)
        callback((False, None, 0.001))

    # Celery's own (celery/concurrency/asynpool.py, _create_timelimit_handlers)
    def on_timeout_set(self, R, soft, hard):
        if soft:
            trefs[R._job] = hub.call_later(soft, self._on_soft_timeout, R._job, soft, hard, hub)
        elif hard:
            trefs[R._job] = hub.call_later(hard, self._on_hard_timeout, R._job)

    def _discard_tref(self, job):
        try:
            tref = trefs.pop(job)
            tref.cancel()
            del tref
        except (KeyError, AttributeError):
            pass

    def on_timeout_cancel(self, R):
        self._discard_tref(R._job)

    def _on_soft_timeout(self, *args):
        raise AssertionError("no limit comes during the benchmark")

    _on_hard_timeout = _on_soft_timeout


pool = Pool()
pool._tref_for_id = trefs
if task.name != "m.plain":
    from celery_deadlines.core.timelimits import JobLimits

    limits = JobLimits(pool, hub)
    pool.on_timeout_set = limits.on_timeout_set
    pool.on_timeout_cancel = limits.on_timeout_cancel
consumer = SimpleNamespace(
    hostname="bench@worker", connection_errors=(), event_dispatcher=None,
    timer=SimpleNamespace(call_at=None), apply_eta_task=None, disable_rate_limits=True,
    task_buckets={}, on_task_request=lambda request: request.execute_using_pool(pool),
    _limit_task=None, _limit_post_eta=None, controller=SimpleNamespace(state=worker_state),
    pool=pool,
)
handler = task.start_strategy(app, consumer)  # the task's own, as a worker's consumer asks
tracer = build_tracer(task.name, task, eager=False, hostname="bench@worker", app=app)
task.__trace__ = tracer
localized = (app.tasks, {"application/json"}, "bench@worker")


def main(message):
    handler(message, None, message.ack_log_error, message.reject_log_error, [])


def child(message):
    fast_trace_task(task.name, message.headers["id"], message.headers, message.body,
                    message.content_type, message.content_encoding, _loc=localized)


run = main if side == "main" else child
for message in messages[:200]:  # warm-up, not counted
    run(message)
gc.collect()
gc.freeze()
# counted: callgrind collects only inside functools.reduce (--toggle-collect)
functools.reduce(lambda _, message: run(message), messages[200:], None)
"""

VARIANTS = ("m.plain", "m.deadline", "m.nobudget")
SIDES = ("publish", "main", "child")


def instructions(tree: Path, variant: str, side: str, count: int) -> int:
    """Instructions executed while ``count`` messages are run (nothing else is counted),
    with ``tree`` imported through a path of the same length whatever its own: the
    counts follow the length of the path the package is imported from (one commit
    counted 157,722 from ``/work/main`` and 155,916 from ``/tmp/exp``), so two trees
    are compared only through paths of one length."""
    with tempfile.TemporaryDirectory(prefix="wi-") as folder:  # a random name, one length
        link = Path(folder) / "tree"
        link.symlink_to(tree.resolve(), target_is_directory=True)
        return collected(LOOP, str(link), str(count), variant, side, toggle="functools_reduce")


def per_message(tree: Path, variant: str, side: str, count: int) -> float:
    return instructions(tree, variant, side, count) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--against", type=Path, help="another source tree to count")
    parser.add_argument("--side", choices=SIDES, action="append")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    trees = [REPO] + ([args.against.resolve()] if args.against else [])
    for side in args.side or SIDES:
        # each tree's ratios are against the plain task counted with that tree on the
        # path: a plain message runs none of the package's code, yet its count moves
        # with the package's layout by about 1 % (bench/README.md, 2026-12-03 20:00)
        plains = [per_message(tree, "m.plain", side, args.messages) for tree in trees]
        line = f"{side:5}  plain Celery task              {plains[0]:9.0f} instructions/message"
        if len(trees) > 1:
            line += f"   {trees[1].name}: {plains[1]:9.0f}"
        print(line, flush=True)
        for variant in VARIANTS[1:]:
            counts = [per_message(tree, variant, side, args.messages) for tree in trees]
            line = (
                f"{side:5}  {variant.removeprefix('m.'):10} this tree {counts[0]:9.0f}"
                f" ({counts[0] / plains[0]:.3f} x plain)"
            )
            if len(counts) > 1:
                ratio = counts[1] / plains[1]
                line += f"   {trees[1].name}: {counts[1]:9.0f} ({ratio:.3f} x its plain)"
            print(line, flush=True)


if __name__ == "__main__":
    main()
