"""A producer process for the crash-point sweep: ``python -m tests.support.sweep_producer
TASK_ID KEY``. It publishes one ``l.sweep_pay`` run and may die at a producer crash
point (``outbox.recorded``, ``outbox.published``) when the plan says so; it prints
``acknowledged`` only if ``apply_async`` returned."""

from __future__ import annotations

import sys

from tests.support import ledgerapp


def main() -> None:
    task_id, key = sys.argv[1], sys.argv[2]
    ledgerapp.sweep_pay.apply_async((key,), task_id=task_id, budget=90)
    print("acknowledged", flush=True)


if __name__ == "__main__":
    main()
