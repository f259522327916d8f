"""Tasks for the in-process worker of pytest-celery's session fixtures (shared tasks)."""

from __future__ import annotations

import time

from celery import shared_task

from celery_deadlines import DeadlineTask


@shared_task(base=DeadlineTask, bind=True, name="inproc.work")
def work(self: DeadlineTask) -> float:
    return self.remaining()


@shared_task(name="inproc.busy")
def busy(seconds: float) -> float:
    time.sleep(seconds)
    return seconds
