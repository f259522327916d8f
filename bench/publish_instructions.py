"""The library's publish code counted in CPU instructions, not seconds.

Wall-clock micro-benchmarks on a shared 2-core machine move by 10-30 % from run to run;
valgrind's callgrind counts the instructions executed, which repeat to a few in a
hundred thousand whatever else the machine is doing. This script runs the same loop as
``bench/overhead.py``'s "library code alone" figure (``DeadlineTask.apply_async`` with
Celery's publish stubbed, plus the ``before_task_publish`` hook) under callgrind twice,
with 0 and ``--calls`` iterations, and prints the difference per call: the library's
own instructions per publish. ``--against PATH`` counts another source tree (a
``git worktree`` of an older commit) in the same run, for a before/after ratio.

Usage: python bench/publish_instructions.py [--calls 5000] [--against ../old-tree]
Needs valgrind (Debian package ``valgrind``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.callgrind import collected  # noqa: E402

#: The measured loop, run in a fresh interpreter with the source tree first on the path.
LOOP = """
import sys
sys.path.insert(0, sys.argv[1])
import celery.app.task
from celery import Celery
from celery_deadlines import DeadlineTask
try:
    from celery_deadlines.core.publishing import on_before_task_publish
except ImportError:  # a tree from before issue 46 (--against) keeps it in core.propagation
    from celery_deadlines.core.propagation import on_before_task_publish

app = Celery("bench-instructions", broker="memory://", set_as_current=False)


def identity(x):
    return x


app.task(base=DeadlineTask, name="m.deadline", shared=False, budget=300)(identity)
if sys.argv[3] == "finalized":
    app.finalize(auto=True)
task = app.tasks["m.deadline"]
stamped = {"id": "x", "task": "m.deadline", "x_deadline": 1.0, "x_deadline_source": "call"}
celery.app.task.Task.apply_async = lambda self, *args, **kwargs: None
for i in range(200 + int(sys.argv[2])):  # 200 warm-up calls in both counts
    task.apply_async((i,))
    on_before_task_publish(sender="m.deadline", headers=stamped, properties={})
"""


def instructions(tree: Path, calls: int, app_state: str) -> int:
    """Instructions executed by the loop with ``calls`` iterations (and start-up)."""
    return collected(LOOP, str(tree), str(calls), app_state)


def per_publish(tree: Path, calls: int, app_state: str) -> float:
    return (instructions(tree, calls, app_state) - instructions(tree, 0, app_state)) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--against", type=Path, help="another source tree to count")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    trees = [REPO] + ([args.against.resolve()] if args.against else [])
    for app_state in ("finalized", "pending"):
        counts = [per_publish(tree, args.calls, app_state) for tree in trees]
        line = f"app {app_state:9}  this tree {counts[0]:9.0f} instructions/publish"
        if len(counts) > 1:
            line += f"   {trees[1]}: {counts[1]:9.0f}   ratio {counts[0] / counts[1]:.3f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
