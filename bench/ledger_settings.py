"""Django settings of the ledger benchmark: both trackers on one PostgreSQL database."""

from __future__ import annotations

import os

import dj_database_url

SECRET_KEY = "bench-only"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    # the admin, for the list pages ledger_scale.py times at two sizes
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_celery_results",
    "celery_deadlines",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "bench.console_urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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
# the admin's pages read the ledger of the size being timed (bench.console_urls.Ledger)
DATABASE_ROUTERS = ["bench.console_urls.LedgerOfTheSize"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cd_bench"),
        conn_max_age=None,  # persistent connections, as production workers use them
    )
}
# the scale comparison's two ledgers (bench/ledger_scale.py), when bench/ledger.py names them
for _alias in ("small", "large"):
    _url = os.environ.get(f"BENCH_{_alias.upper()}_DATABASE_URL")
    if _url:
        DATABASES[_alias] = dj_database_url.parse(_url, conn_max_age=None)
        # their commits are not waited for: the comparison is of the statements' own
        # cost, which the size could change; a commit's flush is the same at any size,
        # and on a busy disk its swings would hide that cost
        DATABASES[_alias]["OPTIONS"] = {"options": "-c synchronous_commit=off"}
