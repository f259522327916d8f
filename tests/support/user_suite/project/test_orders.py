"""The bakery's tests, written as its developers write them: pytest-django's marks,
celery.contrib.pytest's worker, Celery eager in the settings."""

import pytest
from bakery import payments
from bakery.tasks import charge, total
from celery import Celery
from celery.contrib.testing.worker import TestWorkController

from celery_deadlines.models import Effect, Run
from celery_deadlines.testing import FakeLedger


def test_an_eager_charge_is_made_once_and_recorded(deadlines_ledger: FakeLedger) -> None:
    result = charge.delay("eager-1", 12)  # CELERY_TASK_ALWAYS_EAGER
    assert result.get() == "receipt-eager-1"
    assert payments.CHARGES.count(("eager-1", 12)) == 1
    assert deadlines_ledger.effects["order-eager-1:charge"].state == "SUCCEEDED"
    assert deadlines_ledger.run(result.id).status == "SUCCEEDED"


def test_apply_charges_an_order_once_under_its_key(deadlines_ledger: FakeLedger) -> None:
    first = charge.apply(("apply-1", 5))
    again = charge.apply(("apply-1", 5))  # another run, the same order: not charged twice
    assert (first.get(), again.get()) == ("receipt-apply-1", "receipt-apply-1")
    assert payments.CHARGES.count(("apply-1", 5)) == 1
    assert deadlines_ledger.effects["order-apply-1:charge"].dispatches == 1


def test_an_eager_retry_charges_once_the_provider_answers(deadlines_ledger: FakeLedger) -> None:
    payments.UNREACHABLE.add("retry-1")
    result = charge.apply(("retry-1", 7))
    assert result.get() == "receipt-retry-1"
    assert payments.CHARGES.count(("retry-1", 7)) == 1
    run = deadlines_ledger.run(result.id)
    assert (run.status, run.retries, run.attempt) == ("SUCCEEDED", 1, 2)


@pytest.mark.django_db
def test_a_worker_charges_in_a_database_test(
    celery_app: Celery, celery_worker: TestWorkController, deadlines_ledger: FakeLedger
) -> None:
    assert total.delay(1, 2).get(timeout=10) == 3  # a plain task, beside it
    result = charge.delay("worker-1", 3)
    assert result.get(timeout=10) == "receipt-worker-1"
    assert deadlines_ledger.run(result.id).status == "SUCCEEDED"


def test_a_worker_charges_in_a_test_without_a_database(
    celery_app: Celery, celery_worker: TestWorkController
) -> None:
    assert charge.delay("worker-2", 4).get(timeout=10) == "receipt-worker-2"
    assert payments.CHARGES.count(("worker-2", 4)) == 1


@pytest.mark.deadlines_database_ledger
@pytest.mark.django_db(transaction=True)
def test_an_eager_charge_on_the_database_ledger_is_a_run_there() -> None:
    first = charge.delay("database-1", 9)
    again = charge.apply_async(("database-1", 9), task_id=first.id)  # told, not charged
    assert (first.get(), again.get()) == ("receipt-database-1", "receipt-database-1")
    assert payments.CHARGES.count(("database-1", 9)) == 1
    assert Run.objects.get(task_id=first.id).status == "SUCCEEDED"
    assert Effect.objects.get(key="order-database-1:charge").state == "SUCCEEDED"


@pytest.mark.deadlines_database_ledger
@pytest.mark.django_db(transaction=True)
def test_a_worker_charges_on_the_database_ledger_in_a_transactional_test(
    celery_app: Celery, celery_worker: TestWorkController
) -> None:
    result = charge.delay("database-2", 6)
    assert result.get(timeout=10) == "receipt-database-2"
    assert Run.objects.get(task_id=result.id).status == "SUCCEEDED"
    assert Effect.objects.get(key="order-database-2:charge").state == "SUCCEEDED"
