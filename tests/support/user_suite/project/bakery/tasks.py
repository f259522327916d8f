"""The bakery's tasks: a charge made at most once per order (an effect), and a plain one."""

from celery import shared_task

from celery_deadlines import DeadlineTask

from . import payments


@shared_task(base=DeadlineTask, bind=True, budget=60, name="bakery.charge")
def charge(self: DeadlineTask, order: str, amount: int) -> str:
    try:
        with self.effect(
            "charge",
            key=f"order-{order}:charge",
            fingerprint={"amount": amount},
            not_sent=(ConnectionRefusedError,),
        ) as fx:
            if fx.completed:
                return str(fx.result)
            receipt = payments.charge(order, amount)
            fx.succeed(receipt)
    except ConnectionRefusedError as refused:  # recorded NOT_DISPATCHED: safe to retry
        raise self.retry(exc=refused, countdown=0) from refused
    return receipt


@shared_task(name="bakery.total")
def total(*amounts: int) -> int:
    return sum(amounts)
