"""Django system checks: ``manage.py check`` names the setting to fix.

Settings are read the way Celery reads them with ``namespace="CELERY"``: every
``CELERY_DEADLINES_*`` name in Django's settings. An unknown name (a typo) is an error
too, since it would otherwise be ignored without a word; so is an unknown
``deadlines_*`` set on the project's Celery app. Its hint suggests the closest setting.

Every hint ends by naming the section of the documentation to read, as
``Documentation: "<page title>" > "<section>".``: the page's title (its first heading)
and one of its headings, or on the settings reference a setting's Django name (its row
in the table). Hints name no repository path: the docs are read on the web too.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.apps import AppConfig
from django.conf import settings as django_settings
from django.core import checks

from .conf import (
    BUDGETS,
    CONTRACTS,
    DATABASE,
    DEFAULT_ATTEMPT_TIMEOUT,
    DEFAULT_BUDGET,
    DEFAULT_RESERVE,
    LEASE_TTL,
    LEDGER,
    MAX_BUDGET,
    REMAINING_HEADER,
    REQUEST_BUDGET,
    REQUEST_BUDGETS,
    REQUEST_HEADERS,
    RETENTION,
    SETTINGS,
    TRUSTED_PROXIES,
    Setting,
    Settings,
)
from .errors import ConfigurationError
from .rules.contracts import is_deadline_task, review
from .rules.declarations import UNKNOWN, Configured, Problem
from .rules.declarations import review as review_declarations
from .rules.declarations import review_settings as review_declared_settings
from .rules.quoting import named, shown
from .rules.retention import describe_age

if TYPE_CHECKING:
    from celery import Celery, Task

PREFIX = "CELERY_DEADLINES_"
SETTINGS_REFERENCE = "Settings reference"
SYSTEM_CHECKS = "System checks"


def docs(page: str, section: str) -> str:
    """Where a hint sends the reader: a page title and a section (module docstring)."""
    return f'Documentation: "{page}" > "{section}".'


def closest_setting(name: str) -> str | None:
    """The known setting (Celery spelling) closest to ``name``, a likely typo of it."""
    prefix = "deadlines_"  # compared without it, which every name shares
    candidates: dict[str, str] = {}
    for setting in SETTINGS:  # "default_reserve" is also found from "reserve" (or "resrve")
        suffix = setting.name.removeprefix(prefix)
        candidates.setdefault(suffix, setting.name)
        candidates.setdefault(suffix.removeprefix("default_"), setting.name)
    found = difflib.get_close_matches(name.lower().removeprefix(prefix), candidates, n=1)
    return candidates[found[0]] if found else None


def _unknown(spelled: str, name: str, *, django: bool) -> checks.CheckMessage:
    """E002 for ``spelled`` (``name`` in Celery's spelling), suggesting the closest."""
    closest = closest_setting(name)
    if closest is None:
        known = sorted(f"CELERY_{s.name.upper()}" if django else s.name for s in SETTINGS)
        hint = f"Known settings: {', '.join(known)}. {docs(SETTINGS_REFERENCE, SYSTEM_CHECKS)}"
    else:
        suggestion = f"CELERY_{closest.upper()}" if django else closest
        hint = f"Did you mean {suggestion}? " + docs(
            SETTINGS_REFERENCE, f"CELERY_{closest.upper()}"
        )
    where = "" if django else " (set on the Celery app)"
    return checks.Error(
        f"{named(spelled)}{where} is not a celery-deadlines setting.",
        hint=hint,
        id="celery_deadlines.E002",
    )


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


def _cannot_check(
    why: str, *, what: str = f"{PREFIX}CONTRACTS could not be checked against its tasks"
) -> checks.CheckMessage:
    return checks.Warning(
        f"{what}: {why}.",
        hint="Import the project's Celery app where Django starts (the usual "
        "'from .celery import app as celery_app' in the project package). "
        + docs("Quick start", "2. The Celery app"),
        id="celery_deadlines.W001",
    )


@checks.register()
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E001: a setting has a bad value. E002: a ``CELERY_DEADLINES_*`` name (or a
    ``deadlines_*`` name on the project's Celery app) is unknown."""
    given = _given()
    known = {setting.name for setting in SETTINGS}
    messages = [
        _unknown(f"CELERY_{name.upper()}", name, django=True)
        for name in sorted(given.keys() - known)
    ]
    messages += [
        _unknown(name, name, django=False) for name in sorted(_on_the_app() - known - set(given))
    ]
    settings = Settings(given)
    for setting in SETTINGS:
        try:
            settings.get(setting)
        except ConfigurationError as error:
            messages.append(
                checks.Error(
                    str(error),
                    hint=docs(SETTINGS_REFERENCE, setting.django_name),
                    id="celery_deadlines.E001",
                )
            )
    return messages


def _on_the_app() -> set[str]:
    """The ``deadlines_*`` names set on the current Celery app's configuration itself
    (``app.conf.deadlines_x = ...``), not read from Django's settings."""
    from celery import current_app
    from celery.loaders.default import Loader

    if isinstance(current_app.loader, Loader):  # Celery's fallback app, not the project's:
        return set()  # configuring it would only warn that celeryconfig is missing
    try:
        keys = list(current_app.conf.keys())
    except Exception:  # noqa: BLE001 (a check must report, not crash; W001 says more)
        return set()
    return {key for key in keys if isinstance(key, str) and key.startswith("deadlines_")}


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
        tasks = _loaded_tasks(app)
    except Exception as exc:  # noqa: BLE001 (a check must report a failure, not crash)
        return [_cannot_check(f"its tasks did not load: {shown(exc)}")]
    if not any(is_deadline_task(task) for task in tasks.values()):
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
    section = docs("How-tos", "Declare a time contract")
    return [
        checks.Error(problem.message, hint=f"{problem.hint} {section}", id="celery_deadlines.E005")
        if problem.severity == "error"
        else checks.Warning(
            problem.message, hint=f"{problem.hint} {section}", id="celery_deadlines.W002"
        )
        for problem in problems
    ]


#: Celery's task options it keeps only on the task's class (``Task`` has no such
#: attribute): never a misspelled option of this package's.
CELERY_CLASS_OPTIONS = frozenset(
    {
        "autoretry_for",
        "dont_autoretry_for",
        "retry_kwargs",
        "retry_backoff",
        "retry_backoff_max",
        "retry_jitter",
        "store_eager_result",
    }
)


@checks.register()
def check_declarations(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E006 to E009, W006 to W010: what the DeadlineTasks declare (a bad, misfitting or
    misspelled option, a budget the maximum refuses, a lease longer than the budget), the
    ``CELERY_DEADLINES_BUDGETS`` entries that do nothing, and settings that cannot work
    together (:mod:`celery_deadlines.rules.declarations`). A setting that is bad itself is
    E001 (``check_settings``): nothing is checked against it."""
    from celery import current_app as app  # the project's app, once it was imported
    from celery.loaders.default import Loader

    configured = _configured(from_django(), lease_ttl_set=LEASE_TTL.name in _given())
    messages = _messages(review_declared_settings(configured))
    if isinstance(app.loader, Loader):  # Celery's fallback app: the project's is not loaded
        return [*messages, _cannot_check("the project's Celery app is not loaded", what=TASKS)]
    try:
        tasks = _loaded_tasks(app)
    except Exception as exc:  # noqa: BLE001 (a check must report a failure, not crash)
        return [*messages, _cannot_check(f"its tasks did not load: {shown(exc)}", what=TASKS)]
    return messages + _messages(
        review_declarations(tasks, configured, known_attributes=_task_attributes())
    )


TASKS = "The options of the project's tasks could not be checked"


def _task_attributes() -> frozenset[str]:
    """Every attribute a task has as a Celery task or a DeadlineTask: never a typo."""
    from celery import Task

    from .task import DeadlineTask

    return frozenset(dir(Task)) | frozenset(dir(DeadlineTask)) | CELERY_CLASS_OPTIONS


def _configured(settings: Settings, *, lease_ttl_set: bool) -> Configured:
    """The settings a declaration is checked against, each :data:`UNKNOWN` when bad."""

    def value(setting: Setting[Any]) -> Any:
        try:
            return settings.get(setting)
        except ConfigurationError:
            return UNKNOWN  # reported by check_settings

    return Configured(
        default_budget=value(DEFAULT_BUDGET),
        budgets=value(BUDGETS),
        contracts=value(CONTRACTS),
        default_reserve=value(DEFAULT_RESERVE),
        default_attempt_timeout=value(DEFAULT_ATTEMPT_TIMEOUT),
        max_budget=value(MAX_BUDGET),
        lease_ttl=value(LEASE_TTL),
        lease_ttl_set=lease_ttl_set,
        ledger=value(LEDGER),
        trusted_proxies=value(TRUSTED_PROXIES),
        name=lambda name: f"CELERY_{name.upper()}",
    )


def _messages(problems: Sequence[Problem]) -> list[checks.CheckMessage]:
    kind = {"error": checks.Error, "warning": checks.Warning}
    return [
        kind[problem.severity](
            problem.message, hint=f"{problem.hint} {docs(*problem.read)}", id=problem.id
        )
        for problem in problems
    ]


#: Celery's own switch: its Django fixup skips the system checks while it is set.
SKIP_CHECKS = "CELERY_SKIP_CHECKS"


def _loaded_tasks(app: Celery) -> Mapping[str, Task[Any, Any]]:
    """The app's tasks once its modules are imported (autodiscovery), as a worker has them.

    Importing them sends Celery's ``import_modules`` signal, and Celery's Django fixup
    answers that signal by running every system check, this one included, which would
    import again: a recursion some 160 checks deep, ended by a ``RecursionError`` that
    left task modules half-imported (a worker started with 2 of the demo's 9 tasks) and
    this check reporting W001. The checks are running already, so the nested run is
    skipped with the fixup's own switch."""
    with _checks_skipped():
        app.loader.import_default_modules()
    return dict(app.tasks)


@contextmanager
def _checks_skipped() -> Iterator[None]:
    before = os.environ.get(SKIP_CHECKS)
    os.environ[SKIP_CHECKS] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[SKIP_CHECKS]
        else:
            os.environ[SKIP_CHECKS] = before


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
            hint="Keep ended runs at least as long as the longest budget. "
            + docs("How-tos", "Keep the ledger bounded"),
            id="celery_deadlines.W003",
        )
    ]


def _names(names: Sequence[str] | Mapping[str, Any], most: int = 4) -> str:
    """``names`` as a message lists them: each as :func:`named` says, at most ``most``."""
    listed = [named(name) for name in list(names)[:most]]
    more = len(names) - len(listed)
    return ", ".join(listed) + (f" and {more} more" if more > 0 else "")


MIDDLEWARE = "celery_deadlines.middleware.DeadlineMiddleware"
INGRESS_HOWTO = ("How-tos", "Start the deadline at the HTTP request")


@checks.register()
def check_ingress(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W004: request settings are set but DeadlineMiddleware is not in MIDDLEWARE.
    W005: deadline headers are named but no proxy is trusted (none will ever count)."""
    settings = from_django()
    try:
        budgets, headers = settings.get(REQUEST_BUDGETS), settings.get(REQUEST_HEADERS)
        said = {
            REQUEST_BUDGET.django_name: settings.get(REQUEST_BUDGET) is not None,
            REQUEST_BUDGETS.django_name: bool(budgets.by_name or budgets.by_pattern),
            REQUEST_HEADERS.django_name: bool(headers),
            REMAINING_HEADER.django_name: settings.get(REMAINING_HEADER) is not None,
        }
        proxies = settings.get(TRUSTED_PROXIES)
    except ConfigurationError:
        return []  # reported by check_settings
    used = [name for name, set_ in said.items() if set_]
    messages: list[checks.CheckMessage] = []
    if used and MIDDLEWARE not in getattr(django_settings, "MIDDLEWARE", ()):
        names = ", ".join(used)
        messages.append(
            checks.Warning(
                f"{names} set, but {MIDDLEWARE} is not in MIDDLEWARE: no request gets a deadline.",
                hint=f"Add {MIDDLEWARE} to MIDDLEWARE. " + docs(*INGRESS_HOWTO),
                id="celery_deadlines.W004",
            )
        )
    if headers and not proxies:
        messages.append(
            checks.Warning(
                f"{PREFIX}REQUEST_HEADERS names {_names(headers)}, but "
                f"{PREFIX}TRUSTED_PROXIES is empty: no request's header will ever be read.",
                hint="List the addresses or networks of the proxies that send them. "
                + docs(SETTINGS_REFERENCE, f"{PREFIX}TRUSTED_PROXIES"),
                id="celery_deadlines.W005",
            )
        )
    return messages


@checks.register(checks.Tags.database)
def check_ledger_database(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E003: the ledger's database is not PostgreSQL or SQLite. E004: ``USE_TZ`` is off.
    E010: the ledger's alias turns Django's transaction management off (``AUTOCOMMIT``).
    A setting that names no alias at all is E001 (``check_settings``): not looked up."""
    from django.db import connections

    from .ledger.sql.dialect import SUPPORTED

    messages: list[checks.CheckMessage] = []
    try:
        alias = from_django().get(DATABASE)
    except ConfigurationError:  # not an alias at all (a list, a number): E001 says so
        alias = ""
    if alias and alias not in connections.settings:
        messages.append(
            checks.Error(
                f"CELERY_DEADLINES_DATABASE names {shown(alias)}, which is not in DATABASES.",
                hint="Name the alias of the database that holds the run ledger. "
                + docs(SETTINGS_REFERENCE, f"{PREFIX}DATABASE"),
                id="celery_deadlines.E003",
            )
        )
    elif alias and connections[alias].vendor not in SUPPORTED:
        messages.append(
            checks.Error(
                f"The run ledger needs PostgreSQL or SQLite; DATABASES[{shown(alias)}] is "
                f"{connections[alias].vendor}.",
                hint="Point CELERY_DEADLINES_DATABASE at a PostgreSQL or SQLite alias. "
                + docs(SETTINGS_REFERENCE, f"{PREFIX}DATABASE"),
                id="celery_deadlines.E003",
            )
        )
    elif alias and connections.settings[alias].get("AUTOCOMMIT", True) is False:
        # the producer's row joins the caller's transaction and its message goes when
        # that commits (on_commit); a transaction managed by hand has no such hook, so
        # the message would be sent before its row exists for anyone else
        messages.append(
            checks.Error(
                f"DATABASES[{shown(alias)}] sets AUTOCOMMIT = False: a run's row would be "
                "written in a transaction whose commit the library cannot wait for, and "
                "its message sent before the row is committed.",
                hint="Keep AUTOCOMMIT on for the ledger's alias and group writes with "
                "transaction.atomic() (a run published inside it is sent when it "
                "commits), or point CELERY_DEADLINES_DATABASE at an alias that keeps it. "
                + docs(SETTINGS_REFERENCE, f"{PREFIX}DATABASE"),
                id="celery_deadlines.E010",
            )
        )
    if not django_settings.USE_TZ:
        messages.append(
            checks.Error(
                "The run ledger stores instants as aware UTC datetimes: USE_TZ must be True.",
                hint="Set USE_TZ = True. " + docs(SETTINGS_REFERENCE, SYSTEM_CHECKS),
                id="celery_deadlines.E004",
            )
        )
    return messages
