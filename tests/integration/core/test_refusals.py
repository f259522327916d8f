"""An expected refusal is logged once, at WARNING, with its reason: never as Celery's
ERROR "raised unexpected" with a traceback (an error-tracker event for an explained,
expected outcome). Real worker processes, whose logs are read."""

from __future__ import annotations

from typing import Any

import pytest

from celery_deadlines import DeadlineRefused
from tests.support.processes import Transport

pytestmark = pytest.mark.integration


def test_a_refused_retry_is_logged_once_at_warning_without_a_traceback(
    redis: Transport, redis_client: Any, start_worker: Any
) -> None:
    from tests.support.workerapp import flaky

    worker = start_worker(redis)
    result = flaky.apply_async(budget=5)
    with pytest.raises(DeadlineRefused) as refused:
        result.get(timeout=20)
    assert refused.value.reason == "retry_budget_exhausted"
    log = worker.log()
    mentions = [line for line in log.splitlines() if result.id in line and "refused" in line]
    assert len(mentions) == 1, mentions
    assert "WARNING" in mentions[0]
    assert "retry_budget_exhausted" in mentions[0]
    assert "raised unexpected" not in log
    assert "Traceback" not in log
