"""What one test session shares with the machine, named by the environment.

Two suites (or a suite and a benchmark) on one machine must not consume, restore or
flush each other's messages, nor create and drop each other's test database. Each
session takes its own from these variables (the defaults are the names of one session
alone on the machine):

``TEST_POSTGRES_DB`` (``test_celery_deadlines``)
    the PostgreSQL test database (read in tests/settings.py); under pytest-xdist,
    pytest-django suffixes it for each xdist worker (``_gw0``, ``_gw1``).
``TEST_REDIS_BROKER_DB`` (``10,14``)
    the Redis broker databases, one per xdist worker (``gw0`` takes the first): a Redis
    worker restores the unacknowledged messages of its whole database once they are
    older than its visibility timeout, whatever their queue, so two sessions (or two
    xdist workers) running at once never share one. Without xdist only the first is used.
``TEST_REDIS_RESULT_DB`` (``11``)
    the Redis result backend (keys are task ids: the xdist workers share it).
``TEST_REDIS_INPROCESS_DB`` (``8``)
    broker and results of pytest-celery's in-process worker
    (tests/integration/test_inprocess_worker.py).
``TEST_REDIS_DEMO_DB`` (``9``)
    the broker of the demo run on Redis and PostgreSQL (tests/support/demos.py).
``TEST_QUEUE_PREFIX`` (none)
    put before every queue name: the tests' (already unique per test) and the demos'
    (``celery``, ``warehouse``, ``addresses``, which a RabbitMQ vhost shares otherwise).
``TEST_REDIS_PORT`` (``6379``)
    the port of the Redis server of all the databases above (a session on a machine
    whose sixteen databases are taken starts a ``redis-server`` of its own).

Worker subprocesses are handed the URLs and queue names, never these variables.
"""

from __future__ import annotations

import os


def _port() -> int:
    value = os.environ.get("TEST_REDIS_PORT", "6379")
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"TEST_REDIS_PORT={value!r}: a TCP port, e.g. 6379") from None
    if not 0 < number < 65536:
        raise ValueError(f"TEST_REDIS_PORT={value!r}: TCP ports are numbered 1 to 65535")
    return number


REDIS_HOST, REDIS_PORT = "127.0.0.1", _port()

#: The xdist worker running this process (``gw0``, ``gw1``, ...), or ``""`` without xdist.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def redis_url(database: int) -> str:
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/{database}"


def _database(variable: str, default: str) -> int:
    value = os.environ.get(variable, default)
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{variable}={value!r}: a Redis database number, e.g. {default}") from None
    if not 0 <= number <= 15:
        raise ValueError(f"{variable}={value!r}: Redis databases are numbered 0 to 15")
    return number


def broker_databases() -> list[int]:
    """Every broker database ``TEST_REDIS_BROKER_DB`` names (a number, or a list)."""
    value = os.environ.get("TEST_REDIS_BROKER_DB", "10,14")
    try:
        numbers = [int(part) for part in value.split(",")]
    except ValueError:
        raise ValueError(
            f"TEST_REDIS_BROKER_DB={value!r}: Redis database numbers separated by commas, "
            "one per xdist worker (e.g. 10,14)"
        ) from None
    if not all(0 <= number <= 15 for number in numbers):
        raise ValueError(f"TEST_REDIS_BROKER_DB={value!r}: Redis databases are numbered 0 to 15")
    return numbers


def broker_database(worker: str = XDIST_WORKER) -> int:
    """The broker database of the xdist worker ``worker`` (the first one without xdist)."""
    numbers = broker_databases()
    index = int(worker.removeprefix("gw")) if worker else 0
    if index >= len(numbers):
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", index + 1))
        raise ValueError(
            f"pytest runs {count} xdist workers and each needs a Redis broker database of "
            f"its own, but TEST_REDIS_BROKER_DB={os.environ.get('TEST_REDIS_BROKER_DB')!r} "
            f"names {len(numbers)}: name {count} (e.g. TEST_REDIS_BROKER_DB=10,14), or run "
            "fewer workers (-n)"
        )
    return numbers[index]


def queue_name(stem: str) -> str:
    """A queue's name: ``TEST_QUEUE_PREFIX`` and ``stem``."""
    return os.environ.get("TEST_QUEUE_PREFIX", "") + stem


REDIS_BROKER = redis_url(broker_database())
REDIS_RESULTS = redis_url(_database("TEST_REDIS_RESULT_DB", "11"))
REDIS_INPROCESS = redis_url(_database("TEST_REDIS_INPROCESS_DB", "8"))
REDIS_DEMO = redis_url(_database("TEST_REDIS_DEMO_DB", "9"))
