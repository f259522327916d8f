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


@shared_task(base=DeadlineTask, bind=True, name="inproc.retry_once", default_retry_delay=0)
def retry_once(self: DeadlineTask) -> dict[str, object]:
    """No deadline: retries its first attempt, and reports its second one's request."""
    if self.request.retries == 0:
        raise self.retry()
    return {
        "headers": sorted(self.request.headers or {}),
        "depth": len(self.request_stack),
        "retries": self.request.retries,
    }
