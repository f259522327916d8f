"""One producer process of the nemesis soak: ``python -m tests.chaos.producer PLAN OUT``.

PLAN is a JSON list of orders (``task_id``, ``flavour``, ``work``, ``budget``, ``at``:
seconds after the start); each is published at its instant with ``c.order`` and one
line is appended to OUT: ``acknowledged`` true only if ``apply_async`` returned (the
broker or the database may be down: then the caller was told it failed, and the run may
be missing without being lost).
"""

from __future__ import annotations

import json
import os
import sys
import time

#: Publishes of one order before its caller gives up (the broker or database is down).
ATTEMPTS = 4


def main() -> None:
    plan_path, out_path = sys.argv[1], sys.argv[2]
    from django.db import close_old_connections

    from tests.support import chaosapp

    with open(plan_path) as plan:
        orders = json.load(plan)
    start = time.monotonic()
    for entry in orders:
        delay = start + entry["at"] - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        acknowledged, error = False, ""
        for _ in range(ATTEMPTS):  # a caller tries again with the same task id
            close_old_connections()  # as at each request's start: a broken one goes
            try:
                chaosapp.order.apply_async(
                    (entry["task_id"], entry["flavour"], entry["work"]),
                    task_id=entry["task_id"], budget=entry["budget"],
                )  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - the caller is told: the run may or may not exist
                error = repr(exc)[:300]
                time.sleep(0.5)
            else:
                acknowledged = True
                break
        line = {"task_id": entry["task_id"], "acknowledged": acknowledged, "error": error}
        fd = os.open(out_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
    print("producer done", flush=True)


if __name__ == "__main__":
    main()
