"""The README's first command: the demo runs the shop story and explains every task.

Run as a user runs it (a subprocess of ``python -m demo_project.run_demo``), on the
embedded default (SQLite + filesystem transport), on Redis + PostgreSQL and on RabbitMQ;
the three runs are independent (brokers, databases, folders) and run side by side
(tests/support/demos.py), beside every other test of the session.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import service_unavailable
from tests.support import isolation
from tests.support.demos import Demo, running_demos, shared_folder

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Demo]:
    """The selected demos whose services are reachable, started when the session had
    collected its tests (tests/support/demos.py), whichever xdist worker started them."""
    return running_demos(shared_folder(tmp_path_factory))


def assert_story_explained(output: str) -> None:
    lines = output.splitlines()

    def line_of(prefix: str) -> str:
        matches = [line for line in lines if line.startswith(prefix)]
        assert matches, f"no line starts with {prefix!r}:\n{output}"
        return matches[0]

    # the order starts at the customer's request: the view's budget is its deadline
    checkout = line_of("POST /orders/42/checkout/ -> 200: the view's 8 s budget")
    assert "place_order, published by the view, inherits it" in checkout
    assert "(from the scope)" in output  # place_order's deadline: the request's scope
    # a chain that cannot fit the request's budget is refused whole, with its arithmetic
    wrap = line_of("POST /orders/42/gift-wrap/ -> 503: the chain wrap_gift -> engrave_card")
    assert "workflow_cannot_fit: the workflow needs 11.000 s" in wrap
    assert re.search(r"but [78]\.\d{3} s left$", wrap), wrap  # the request's 8 s, less its time
    assert "SUCCEEDED, started with" in line_of("place_order ")
    assert "SUCCEEDED, started with" in line_of("reserve_stock ")
    assert "(from the parent)" in output
    # one word per situation: the ledger's status and the gate's reason, nowhere another
    assert line_of("charge_card ").endswith("EXPIRED at the retry gate: retry_budget_exhausted")
    assert line_of("print_label ").endswith("EXPIRED at the claim gate: deadline_passed")
    assert "ledger: EXPIRED (deadline_passed), 0 claim(s)" in output
    assert "ledger: EXPIRED (retry_budget_exhausted)" in output
    assert "ledger: EXPIRED (deadline_passed), 0 claim(s)" in output  # order 43
    assert "order 43 placed with a deadline 1 s ago -> refused at once" in output
    assert "a retry needs" in output
    # one charge per order, although the provider lost its first reply (seed 000 fixture 4)
    assert "provider charges for order-42:capture:v1: 1 (replayed after reconciling" in output
    assert "SUCCEEDED, started with" in line_of("capture_payment ")
    # the notice lives by the 60 s delivery deadline, not the 8 s execution deadline
    notice = line_of("send_confirmation ")
    assert "SUCCEEDED, started with" in notice
    assert float(notice.split("started with ")[1].split(" s left")[0]) > 8
    # seed 003: the order moved to the locked warehouse queue while the worker was down;
    # the resumed plan is refused with a reason the user can read, and nothing changed
    assert "change_address FAILED on resume: assumption_changed" in output
    assert "REFUSED" not in output
    assert "expired_before_claim" not in output
    assert "order_state was 'open', is now 'locked_for_warehouse'" in output
    assert "plan address-42: INVALIDATED assumption_changed" in output
    assert "ledger: FAILED (assumption_changed), 2 claim(s)" in output
    assert "the order's address is still 'Alte Str. 1, Berlin'" in output


def test_the_demo_explains_the_story_on_the_embedded_default(demos: dict[str, Demo]) -> None:
    output = demos["embedded"].output()
    assert "broker filesystem://, database sqlite3" in output
    assert_story_explained(output)


def test_the_demo_runs_on_redis_and_postgresql(demos: dict[str, Demo]) -> None:
    if "redis-postgresql" not in demos:
        service_unavailable("Redis 127.0.0.1:6379 or PostgreSQL 127.0.0.1:5432")
    output = demos["redis-postgresql"].output()
    assert f"broker {isolation.REDIS_DEMO}, database postgresql" in output
    assert_story_explained(output)


def test_the_demo_runs_on_rabbitmq(demos: dict[str, Demo]) -> None:
    if "rabbitmq" not in demos:
        service_unavailable("RabbitMQ 127.0.0.1:5672")
    output = demos["rabbitmq"].output()
    assert "broker amqp://guest:**@127.0.0.1:5672//, database sqlite3" in output  # no password
    assert_story_explained(output)
