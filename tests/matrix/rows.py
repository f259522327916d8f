"""The matrix's rows: each a configuration real projects run, over the project's
production settings (``config/settings/production.py``, cookiecutter-django's shape).

A row names what it stands for among the configurations of issue 45 (``covers``):
``test_every_configuration_of_the_issue_has_a_row`` holds that none is left out. Rows
that share nothing but a worker would run alike share one (the serializers: one worker
accepts all three, the scenario runs once with each).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

#: Every configuration the matrix must run (issue 45, item 8), as the rows name them.
CONFIGURATIONS = (
    "app-wide limits in settings",
    "app-wide limits on the command line",
    "task_always_eager",
    "task_acks_late + task_reject_on_worker_lost",
    "worker_prefetch_multiplier = 1",
    "task_track_started",
    "result_extended",
    "json",
    "msgpack",
    "pickle",
    "views under ATOMIC_REQUESTS",
    "CONN_MAX_AGE",
    "Django's connection pool",
    "prefork",
    "threads",
    "solo",
    "gevent",
    "eventlet",
    "Redis",
    "RabbitMQ",
    "Celery 5.5",
    "Celery 5.6",
    "Celery 5.7",
)

#: The probes of the scenario (tests/matrix/scenario.py); a row runs all of them unless
#: it names fewer.
PROBES = (
    "order",  # published from a view with a budget; its child charges once; explain
    "refusal",  # waited in the queue past its deadline: refused, the caller told
    "retry-refused",  # a retry the deadline cannot hold: refused, the caller told
    "max-retries",  # Celery's own max_retries, before the deadline
    "overrun",  # runs past its deadline: what the pool stops, what the ledger fences
    "own-limit",  # the project's own time limit, shorter than the deadline, kept
)

#: App-wide limits of the rows that set them shorter than the deadline: hard, soft (s);
#: the issue's trial's. They apply to every task of the project (the order's too, whose
#: first attempt in a new pool process takes about a second on a loaded machine).
SHORT_LIMITS = (6.0, 3.0)


@dataclass(frozen=True)
class Row:
    name: str
    covers: tuple[str, ...]
    #: Django settings over production's (``MATRIX_SETTINGS``); ``DATABASES__default__X``
    #: sets one key of the alias
    settings: dict[str, Any] = field(default_factory=dict)
    pool: str = "prefork"
    concurrency: int = 3
    #: more arguments of ``celery worker``
    worker_args: tuple[str, ...] = ()
    broker: str = "redis"
    #: the Celery release the row runs on (its session's environment: see the Makefile)
    celery: str = "5.7"
    settings_module: str = "production"
    serializers: tuple[str, ...] = ("json",)
    probes: tuple[str, ...] = PROBES

    @property
    def limits_short(self) -> bool:
        """Whether the project's own limits are shorter than the scenario's deadlines."""
        return "own-limit" in self.probes


_ALL_BUT_OWN_LIMIT = tuple(p for p in PROBES if p != "own-limit")
_SHORT = {
    "CELERY_TASK_TIME_LIMIT": SHORT_LIMITS[0],
    "CELERY_TASK_SOFT_TIME_LIMIT": SHORT_LIMITS[1],
}

ROWS = (
    Row(
        "production",
        (
            "prefork",
            "Redis",
            "Celery 5.7",
            "json",
            "result_extended",
            "views under ATOMIC_REQUESTS",
            "CONN_MAX_AGE",
        ),
        probes=_ALL_BUT_OWN_LIMIT,
    ),
    Row("limits-in-settings", ("app-wide limits in settings",), settings=_SHORT),
    Row(
        "limits-on-command-line",
        ("app-wide limits on the command line",),
        settings={"CELERY_TASK_TIME_LIMIT": None, "CELERY_TASK_SOFT_TIME_LIMIT": None},
        worker_args=(f"--time-limit={SHORT_LIMITS[0]}", f"--soft-time-limit={SHORT_LIMITS[1]}"),
    ),
    # eager retries are Celery's own inline recursion: no max-retries probe
    Row(
        "eager",
        ("task_always_eager",),
        settings_module="local",
        probes=("order", "refusal", "retry-refused", "overrun"),
    ),
    Row(
        "acks-late",
        ("task_acks_late + task_reject_on_worker_lost",),
        settings={"CELERY_TASK_ACKS_LATE": True, "CELERY_TASK_REJECT_ON_WORKER_LOST": True},
        probes=_ALL_BUT_OWN_LIMIT,
    ),
    Row(
        "prefetch-1",
        ("worker_prefetch_multiplier = 1",),
        settings={"CELERY_WORKER_PREFETCH_MULTIPLIER": 1},
        probes=_ALL_BUT_OWN_LIMIT,
    ),
    Row(
        "track-started",
        ("task_track_started",),
        settings={"CELERY_TASK_TRACK_STARTED": True},
        probes=_ALL_BUT_OWN_LIMIT,
    ),
    Row(
        "serializers",
        ("json", "msgpack", "pickle"),
        settings={"CELERY_ACCEPT_CONTENT": ["json", "msgpack", "pickle"]},
        serializers=("json", "msgpack", "pickle"),
        probes=("order", "refusal", "retry-refused"),
    ),
    Row(
        "connection-pool",
        ("Django's connection pool",),
        settings={
            "DATABASES__default__CONN_MAX_AGE": 0,
            "DATABASES__default__OPTIONS": {"pool": True},
        },
        probes=_ALL_BUT_OWN_LIMIT,
    ),
    Row("threads", ("threads",), pool="threads", concurrency=4, probes=_ALL_BUT_OWN_LIMIT),
    Row("solo", ("solo",), pool="solo", concurrency=1, probes=_ALL_BUT_OWN_LIMIT),
    Row("gevent", ("gevent",), pool="gevent", concurrency=4, probes=_ALL_BUT_OWN_LIMIT),
    Row("eventlet", ("eventlet",), pool="eventlet", concurrency=4, probes=_ALL_BUT_OWN_LIMIT),
    Row("rabbitmq", ("RabbitMQ",), broker="rabbitmq", probes=_ALL_BUT_OWN_LIMIT),
    # the older releases' environments (make matrix-env, matrix-unit-env): the scenario
    # less the overrun (the pools' own rows run it on 5.7)
    Row(
        "celery-5.5",
        ("Celery 5.5",),
        celery="5.5",
        probes=("order", "refusal", "retry-refused", "max-retries", "own-limit"),
        settings=_SHORT,
    ),
    Row(
        "celery-5.6",
        ("Celery 5.6",),
        celery="5.6",
        probes=("order", "refusal", "retry-refused", "max-retries", "own-limit"),
        settings=_SHORT,
    ),
)


def redis_url() -> str:
    """The Redis database of the matrix's brokers and results (``TEST_MATRIX_REDIS_URL``;
    database 15 of the machine's Redis by default: no other session of the suite uses it)."""
    return os.environ.get("TEST_MATRIX_REDIS_URL", "redis://127.0.0.1:6379/15")


def amqp_url() -> str:
    """The RabbitMQ broker of the RabbitMQ row (``TEST_MATRIX_AMQP_URL``; a vhost of
    your own keeps two sessions' queues apart)."""
    return os.environ.get("TEST_MATRIX_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


#: Checks that fail today, each for a bug being fixed in another branch: ``make
#: matrix-configs`` leaves them out and names them in its summary (``MATRIX_AWAITING=run``
#: runs them). Empty this list as the fixes merge: a check left here is a promise not
#: tested. Keys: (row name, or "*" for every row; the test's name).
AWAITING_FIXES: dict[tuple[str, str], str] = {}
