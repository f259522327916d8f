"""Settings of the demo shop.

Embedded default: SQLite and kombu's filesystem transport under ``demo_project/var/``,
no server needed. ``DATABASE_URL`` (e.g. ``postgres://postgres@127.0.0.1/test``) and
``CELERY_BROKER_URL`` (``redis://127.0.0.1:6379/0``, ``amqp://guest:guest@127.0.0.1//``)
switch to real services; ``DEMO_QUEUE_PREFIX`` names its queues apart from another run's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent
VAR_DIR = Path(os.environ.get("DEMO_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-not-a-secret")
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_results",
    "celery_deadlines",
    "demo_project.shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # every request under its view's budget (@deadline_budget): the tasks it publishes
    # inherit that deadline
    "celery_deadlines.middleware.DeadlineMiddleware",
]

ROOT_URLCONF = "demo_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

_sqlite_options: dict[str, Any] = {
    "timeout": 20,
    "transaction_mode": "IMMEDIATE",
    "init_command": "PRAGMA journal_mode=WAL;",
}
DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{VAR_DIR / 'demo.sqlite3'}", conn_max_age=0
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"].setdefault("OPTIONS", {}).update(_sqlite_options)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

# -- Celery: everything below is read with namespace="CELERY" ----------------------------
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL == "filesystem://":
    # kombu's transport, each message written whole before a worker can read it
    CELERY_BROKER_TRANSPORT = "demo_project.broker:Transport"
    _broker_dir = VAR_DIR / "broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "store_processed": False,
        "control_folder": str(_broker_dir / "control"),
        "polling_interval": 0.1,
    }
CELERY_RESULT_BACKEND = "django-db"
CELERY_RESULT_EXTENDED = True
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# The demo's queues: DEMO_QUEUE_PREFIX (default none) goes before each name, so that two
# demo runs on one broker (two test sessions on one machine) never take each other's work.
DEMO_QUEUE_PREFIX = os.environ.get("DEMO_QUEUE_PREFIX", "")
CELERY_TASK_DEFAULT_QUEUE = f"{DEMO_QUEUE_PREFIX}celery"
DEMO_WAREHOUSE_QUEUE = f"{DEMO_QUEUE_PREFIX}warehouse"
DEMO_ADDRESS_QUEUE = f"{DEMO_QUEUE_PREFIX}addresses"

# -- celery-deadlines ----------------------------------------------------------------------
CELERY_DEADLINES_DEFAULT_RESERVE = 0.5
CELERY_DEADLINES_CLOCK_SKEW_ALLOWANCE = 0.25
CELERY_DEADLINES_BUDGETS = {"demo_project.shop.tasks.print_label": 3}
# The run ledger (this app is in INSTALLED_APPS): reconcile every second, so a message
# left in a queue past its deadline is expired by the sweeper within a second.
CELERY_DEADLINES_RECONCILE_INTERVAL = 1
# Say in each response how much of the request's budget was left (off by default).
CELERY_DEADLINES_REMAINING_HEADER = "X-Deadline-Remaining-Ms"
# The address change's time contract (docs/explanation/time-contracts.md): one reviewable
# block. A resumed plan whose assumptions no longer hold is refused, with the reason,
# rather than executed.
CELERY_DEADLINES_CONTRACTS = {
    "demo_project.shop.tasks.change_address": {
        "budget": 120,
        "lease_ttl": 30,
        "observation_ttl": {"order_state": 30, "customer_confirmation": 300},
        "revalidate_before": ["order_state", "customer_confirmation"],
        "on_expiry": "refuse",
    },
}
# A message the broker lost (a worker stopped with a retry waiting in its memory) is
# published again this long after it was due.
CELERY_DEADLINES_REPUBLISH_AFTER = 5
