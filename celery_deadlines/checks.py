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

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.apps import AppConfig
from django.conf import settings as django_settings
from django.core import checks

from .conf import (
    CONTRACTS,
    DATABASE,
    DATABASE_CAP,
    LEASE_TTL,
    MAX_BUDGET,
    REMAINING_HEADER,
    REQUEST_BUDGET,
    REQUEST_BUDGETS,
    REQUEST_HEADERS,
    RETENTION,
    SETTINGS,
    TRUSTED_PROXIES,
    Settings,
)
from .core.preflight import (
    ON_THE_APP,
    SETTINGS_REFERENCE,
    SYSTEM_CHECKS,
    Finding,
    bad_values,
    configured,
    contract_problems,
    docs,
    finding,
    task_attributes,
    unknown_name,
)
from .core.preflight import closest_setting as closest_setting  # where the tests look for it
from .errors import ConfigurationError
from .rules import database as database_cap
from .rules.contracts import is_deadline_task, review
from .rules.declarations import Configured, Problem
from .rules.declarations import review as review_declarations
from .rules.declarations import review_settings as review_declared_settings
from .rules.quoting import named, shown
from .rules.retention import describe_age

if TYPE_CHECKING:
    from celery import Celery, Task

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
    ``deadlines_*`` name on the project's Celery app) is unknown. (The rules:
    :mod:`celery_deadlines.core.preflight`, which a worker checks its own settings with.)"""
    given = _given()
    known = {setting.name for setting in SETTINGS}
    problems = [
        unknown_name(f"CELERY_{name.upper()}", name, namespace="CELERY")
        for name in sorted(given.keys() - known)
    ]
    problems += [
        unknown_name(name, name, namespace=None, where=ON_THE_APP)
        for name in sorted(_on_the_app() - known - set(given))
    ]
    return _messages(problems + bad_values(Settings(given)))


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
    return _messages(contract_problems(problems))


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
        review_declarations(tasks, configured, known_attributes=task_attributes(tasks.values()))
    )


TASKS = "The options of the project's tasks could not be checked"


def _configured(settings: Settings, *, lease_ttl_set: bool) -> Configured:
    """The settings a declaration is checked against, named as Django's settings."""
    return configured(
        settings, lease_ttl_set=lease_ttl_set, name=lambda name: f"CELERY_{name.upper()}"
    )


def _messages(problems: Sequence[Problem]) -> list[checks.CheckMessage]:
    kind = {"error": checks.Error, "warning": checks.Warning}
    messages: list[checks.CheckMessage] = []
    for problem in problems:
        said = finding(problem)
        messages.append(kind[problem.severity](said.message, hint=said.hint, id=said.id))
    return messages


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


#: Databases whose running statements the cap cannot end (a statement is only not started
#: once the deadline has passed): core/database.py caps PostgreSQL and SQLite.
_UNCAPPED_VENDORS = ("mysql", "oracle")
#: PgBouncer's default port: the one sign of it in an alias's settings.
_PGBOUNCER_PORT = "6432"
#: The how-to's section on connection pools and PgBouncer.
_POOLS = docs("End a task's database queries by its deadline", "Behind a connection pool")


@checks.register(checks.Tags.database)
def check_database_cap(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W011: ``CELERY_DEADLINES_DATABASE_CAP`` names an alias ``DATABASES`` does not have.
    W012: it names one whose running queries the cap cannot end (MySQL, MariaDB, Oracle).
    W013: a capped PostgreSQL alias on PgBouncer's port without
    ``DISABLE_SERVER_SIDE_CURSORS``: in transaction mode the session's setting would
    reach other clients. A list is checked for W011 and W012 (``True`` caps what can be
    capped); a bad value is E001."""
    from django.db import connections

    try:
        setting = from_django().get(DATABASE_CAP)
    except ConfigurationError:
        return []
    messages: list[checks.CheckMessage] = []
    hint = docs(SETTINGS_REFERENCE, f"{PREFIX}DATABASE_CAP")
    for alias in [] if isinstance(setting, bool) else sorted(setting):
        if alias not in connections.settings:
            messages.append(
                checks.Warning(
                    f"{PREFIX}DATABASE_CAP names {shown(alias)}, which is not in DATABASES: "
                    "nothing is capped for it.",
                    hint="Name the aliases whose queries a task's deadline should end. " + hint,
                    id="celery_deadlines.W011",
                )
            )
        elif connections[alias].vendor in _UNCAPPED_VENDORS:
            messages.append(
                checks.Warning(
                    f"{PREFIX}DATABASE_CAP names {shown(alias)}, a "
                    f"{connections[alias].vendor} database: a query started before the "
                    "deadline runs to its end (only one started after it is refused).",
                    hint="Bound its queries with the server's own timeout "
                    "(max_execution_time, max_statement_time). " + hint,
                    id="celery_deadlines.W012",
                )
            )
    for alias in database_cap.chosen(setting, sorted(connections.settings)):
        found = connections.settings[alias]
        if (
            connections[alias].vendor == "postgresql"
            and str(found.get("PORT") or "") == _PGBOUNCER_PORT
            and not found.get("DISABLE_SERVER_SIDE_CURSORS")
        ):
            messages.append(
                checks.Warning(
                    f"Database {shown(alias)} connects to port {_PGBOUNCER_PORT}, PgBouncer's: "
                    "if PgBouncer pools it by transaction, the timeouts a task's deadline "
                    "sets for the session reach the other clients of its server connection.",
                    hint="Set DISABLE_SERVER_SIDE_CURSORS on the alias, as Django asks of "
                    "PgBouncer's transaction mode: the deadline then sets only a "
                    "transaction's timeouts there. In session mode, or if this is not "
                    "PgBouncer, silence celery_deadlines.W013. " + _POOLS,
                    id="celery_deadlines.W013",
                )
            )
    return messages


def errors(also: Sequence[Finding] = ()) -> list[Finding]:
    """Every error of this package's system checks, and ``also`` (those of values set on
    a Celery app itself), that ``SILENCED_SYSTEM_CHECKS`` does not silence: what stops a
    worker or beat of the project (``manage.py check`` fails on the same). Only this
    module's checks run: the project's others are its own affair."""
    from django.core.checks.registry import registry

    found: list[checks.CheckMessage] = []
    for check in registry.get_checks(include_deployment_checks=False):
        if getattr(check, "__module__", None) == __name__:
            found += check(app_configs=None, databases=None)
    found += [checks.Error(error.message, hint=error.hint, id=error.id) for error in also]
    return [
        Finding(message.id or "", message.msg, message.hint or "")
        for message in found
        if message.is_serious() and not message.is_silenced()
    ]
