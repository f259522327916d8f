"""Django system checks: ``manage.py check`` names the setting to fix.

Settings are read the way Celery reads them with ``namespace="CELERY"``: every
``CELERY_DEADLINES_*`` name in Django's settings. An unknown name (a typo) is an error
too, since it would otherwise be ignored without a word.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings as django_settings
from django.core import checks

from .conf import CONTRACTS, MAX_BUDGET, RETENTION, SETTINGS, Settings
from .contracts import review
from .errors import ConfigurationError
from .retention import describe_age

PREFIX = "CELERY_DEADLINES_"


def _given() -> dict[str, Any]:
    """Every ``CELERY_DEADLINES_*`` setting, under its Celery name."""
    return {
        name[len("CELERY_") :].lower(): getattr(django_settings, name)
        for name in dir(django_settings)
        if name.startswith(PREFIX)
    }


def from_django() -> Settings:
    """The settings as Django's ``CELERY_DEADLINES_*`` give them: what a ``manage.py``
    command reads, whichever Celery app is (or is not) loaded."""
    return Settings(_given())


def _cannot_check(why: str) -> checks.CheckMessage:
    return checks.Warning(
        f"{PREFIX}CONTRACTS could not be checked against its tasks: {why}.",
        hint="Import the project's Celery app where Django starts (the usual "
        "'from .celery import app as celery_app' in the project package).",
        id="celery_deadlines.W001",
    )


@checks.register()
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E001: a setting has a bad value. E002: a ``CELERY_DEADLINES_*`` name is unknown."""
    given = _given()
    known = {setting.name for setting in SETTINGS}
    messages: list[checks.CheckMessage] = [
        checks.Error(
            f"CELERY_{name.upper()} is not a celery-deadlines setting.",
            hint="Known settings: " + ", ".join(sorted(f"CELERY_{k.upper()}" for k in known)),
            id="celery_deadlines.E002",
        )
        for name in sorted(given.keys() - known)
    ]
    for error in Settings(given).check():
        messages.append(
            checks.Error(str(error), hint="See docs/settings.md.", id="celery_deadlines.E001")
        )
    return messages


@checks.register()
def check_contracts(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E005: a time contract does not fit the task it names (a time limit or a retry
    backoff it cannot honour, a value also set on the task, no such task). A contract
    that is wrong on its own is E001, like any bad setting."""
    if not getattr(django_settings, f"{PREFIX}CONTRACTS", None):
        return []
    try:  # read with every other setting of the project (deadlines_max_budget, ...)
        contracts = Settings(_given()).get(CONTRACTS)
    except ConfigurationError:
        return []  # reported by check_settings
    from celery import current_app as app  # the project's app, once it was imported

    try:
        app.loader.import_default_modules()  # the worker does this too: autodiscovery
        tasks = dict(app.tasks)
    except Exception as exc:  # noqa: BLE001 (a check must report a failure, not crash)
        return [_cannot_check(f"its tasks did not load: {exc!r}")]
    if not any(hasattr(task, "lease_duration") for task in tasks.values()):
        # Celery's fallback app, not the project's: every contract would look unknown
        return [_cannot_check("the project's Celery app (with its DeadlineTasks) is not loaded")]
    problems = review(
        contracts,
        tasks,
        str(app.conf.broker_url or ""),
        app.conf.broker_transport_options or {},
        setting=f"{PREFIX}CONTRACTS",
    )
    # a task missing from this process's registry may be a module not imported here
    # (autodiscovery differs between a worker and manage.py): a warning, not an error
    return [
        checks.Error(problem.message, hint=problem.hint, id="celery_deadlines.E005")
        if problem.severity == "error"
        else checks.Warning(problem.message, hint=problem.hint, id="celery_deadlines.W002")
        for problem in problems
    ]


@checks.register()
def check_retention(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W003: ended runs are purged sooner than a run may live (``deadlines_max_budget``)."""
    settings = from_django()
    try:
        retention, longest = settings.get(RETENTION), settings.get(MAX_BUDGET)
    except ConfigurationError:
        return []  # reported by check_settings
    if retention is None or retention >= longest:
        return []
    return [
        checks.Warning(
            f"{PREFIX}RETENTION ({describe_age(retention)}) is shorter than "
            f"{PREFIX}MAX_BUDGET ({describe_age(longest)}): a run still alive may ask "
            "again for an effect key whose record was purged, and dispatch it again.",
            hint="Keep ended runs at least as long as the longest budget "
            "(docs/howto.md, 'Keep the ledger bounded').",
            id="celery_deadlines.W003",
        )
    ]


@checks.register(checks.Tags.database)
def check_ledger_database(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E003: the ledger's database is not PostgreSQL or SQLite. E004: ``USE_TZ`` is off."""
    from django.db import connections

    from .ledger.sql.dialect import SUPPORTED

    messages: list[checks.CheckMessage] = []
    alias = getattr(django_settings, f"{PREFIX}DATABASE", "default")
    if alias not in connections.settings:
        messages.append(
            checks.Error(
                f"CELERY_DEADLINES_DATABASE names {alias!r}, which is not in DATABASES.",
                hint="Name the alias of the database that holds the run ledger.",
                id="celery_deadlines.E003",
            )
        )
    elif connections[alias].vendor not in SUPPORTED:
        messages.append(
            checks.Error(
                f"The run ledger needs PostgreSQL or SQLite; DATABASES[{alias!r}] is "
                f"{connections[alias].vendor}.",
                hint="Point CELERY_DEADLINES_DATABASE at a PostgreSQL or SQLite alias.",
                id="celery_deadlines.E003",
            )
        )
    if not django_settings.USE_TZ:
        messages.append(
            checks.Error(
                "The run ledger stores instants as aware UTC datetimes: USE_TZ must be True.",
                hint="Set USE_TZ = True.",
                id="celery_deadlines.E004",
            )
        )
    return messages
