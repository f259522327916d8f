"""A worker or beat refuses to start on a configuration the library's checks reject.

A ``celery worker`` (Celery's ``worker_init``) and ``celery beat`` (``beat_init``) whose
process uses the library check its configuration before they take or send anything,
and exit with status 1 on an error, writing each as ``manage.py check`` writes it: its
id, its message (a setting named in both spellings, the value cut, what it must be)
and its hint (the fix, and the section of the docs to read). Warnings never stop them.

Which errors: in a Django project (the Django app ready), every error of the package's
system checks that ``SILENCED_SYSTEM_CHECKS`` does not silence (``E001`` to ``E010``,
those ``manage.py check`` fails on), and ``E001`` and ``E002`` of values set on the
Celery app itself; without Django, the checks that need none, on the app's own
configuration and tasks: a bad value (``E001``), an unknown ``deadlines_*`` name
(``E002``), a contract that does not fit its task (``E005``), a task's bad or misfitting
option (``E006``, ``E007``, ``E009``) and defaults that cannot work together (``E008``).
Each rule is written once: the system checks (:mod:`celery_deadlines.checks`) build
their ``E001``, ``E002`` and ``E005`` to ``E009`` from the functions here.

Why an exit and not an exception: Celery's signal dispatch catches every ``Exception``
a receiver raises, logs it and goes on (``celery/utils/dispatch/signal.py``), so a
worker would start anyway. ``SystemExit`` is no ``Exception``: raised from
``worker_init`` it leaves the worker's construction before its pool, consumer and
pidfile exist, and from ``beat_init`` beat's service before its first tick.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from celery.signals import beat_init, worker_init

from .. import conf
from ..conf import SETTINGS, Setting, Settings, settings_for
from ..errors import ConfigurationError
from ..rules import contracts as contract_rules
from ..rules import declarations
from ..rules.declarations import UNKNOWN, Configured, Problem
from ..rules.quoting import named
from .body import AttemptAPI

SETTINGS_REFERENCE: Final = "Settings reference"
SYSTEM_CHECKS: Final = "System checks"
CONTRACT_HOWTO: Final = ("How-tos", "Declare a time contract")
#: Every setting's Celery name starts with this.
PREFIX: Final = "deadlines_"


def docs(page: str, section: str) -> str:
    """Where a hint sends the reader: a page title and a section (see checks.py)."""
    return f'Documentation: "{page}" > "{section}".'


@dataclass(frozen=True, slots=True)
class Finding:
    """One error as ``manage.py check`` writes it: id, message, hint."""

    id: str
    message: str
    hint: str

    def __str__(self) -> str:
        return f"({self.id}) {self.message}" + (f"\n\tHINT: {self.hint}" if self.hint else "")


def finding(problem: Problem) -> Finding:
    """A :class:`Problem` as its check reports it: the hint followed by where to read."""
    return Finding(
        problem.id, problem.message, " ".join(filter(None, (problem.hint, docs(*problem.read))))
    )


# -- E001, E002: the settings ------------------------------------------------------------------


def bad_values(settings: Settings) -> list[Problem]:
    """E001: each setting whose value :meth:`Settings.check` refuses."""
    return [
        Problem(
            "error",
            "celery_deadlines.E001",
            str(error),
            "",
            (SETTINGS_REFERENCE, setting.django_name),
        )
        for setting, error in settings.failing()
    ]


def closest_setting(name: str) -> str | None:
    """The known setting (Celery spelling) closest to ``name``, a likely typo of it."""
    candidates: dict[str, str] = {}
    for setting in SETTINGS:  # "default_reserve" is also found from "reserve" (or "resrve")
        suffix = setting.name.removeprefix(PREFIX)
        candidates.setdefault(suffix, setting.name)
        candidates.setdefault(suffix.removeprefix("default_"), setting.name)
    found = difflib.get_close_matches(name.lower().removeprefix(PREFIX), candidates, n=1)
    return candidates[found[0]] if found else None


#: How E002 says where a name it does not know was set, when not in Django's settings.
ON_THE_APP: Final = " (set on the Celery app)"


def unknown_name(spelled: str, name: str, *, namespace: str | None, where: str = "") -> Problem:
    """E002 for ``spelled`` (``name`` in Celery's spelling), suggesting the closest
    setting spelled the same way: with ``namespace`` (Django's ``CELERY``) as
    ``<NAMESPACE>_DEADLINES_...``, without it as ``deadlines_...``."""

    def spell(setting: str) -> str:
        return f"{namespace}_{setting.upper()}" if namespace else setting

    closest = closest_setting(name)
    if closest is None:
        known = sorted(spell(setting.name) for setting in SETTINGS)
        hint, read = f"Known settings: {', '.join(known)}.", (SETTINGS_REFERENCE, SYSTEM_CHECKS)
    else:
        hint = f"Did you mean {spell(closest)}?"
        read = (SETTINGS_REFERENCE, f"CELERY_{closest.upper()}")
    return Problem(
        "error",
        "celery_deadlines.E002",
        f"{named(spelled)}{where} is not a celery-deadlines setting.",
        hint,
        read,
    )


def unknown_names(app: Any, *, namespaced: bool) -> list[Problem]:
    """E002 for each name set in ``app``'s configuration that is no setting: every
    ``deadlines_*`` key, and with ``namespaced`` every ``<NAMESPACE>_DEADLINES_*`` key of
    an app configured with a namespace (``config_from_object(..., namespace=...)``)."""
    try:
        listed = list(app.conf.keys())
    except Exception:  # noqa: BLE001 (a configuration that cannot be listed names nothing)
        return []
    known = {setting.name for setting in SETTINGS}
    namespace = getattr(app, "namespace", None) if namespaced else None
    spaced = f"{namespace}_{PREFIX}".upper() if isinstance(namespace, str) else None
    problems = []
    for key in sorted(key for key in listed if isinstance(key, str)):
        if key.startswith(PREFIX) and key not in known:
            problems.append(unknown_name(key, key, namespace=None, where=ON_THE_APP))
        elif spaced is not None and key.startswith(spaced):
            name = key[len(spaced) - len(PREFIX) :].lower()
            if name not in known:
                problems.append(unknown_name(key, name, namespace=namespace, where=ON_THE_APP))
    return problems


def lease_ttl_set(app: Any) -> bool:
    """Whether ``app``'s configuration sets ``deadlines_lease_ttl`` (in any spelling)."""
    missing = object()
    try:
        return app.conf.get(conf.LEASE_TTL.name, missing) is not missing
    except Exception:  # noqa: BLE001 (then its value is E001's to report)
        return True


# -- E005 to E009: what the tasks declare --------------------------------------------------------


def configured(
    settings: Settings, *, lease_ttl_set: bool, name: Callable[[str], str]
) -> Configured:
    """The settings a declaration is checked against, each :data:`UNKNOWN` when bad (E001
    says that one); ``name`` spells a setting in messages."""

    def value(setting: Setting[Any]) -> Any:
        try:
            return settings.get(setting)
        except ConfigurationError:
            return UNKNOWN

    return Configured(
        default_budget=value(conf.DEFAULT_BUDGET),
        budgets=value(conf.BUDGETS),
        contracts=value(conf.CONTRACTS),
        default_reserve=value(conf.DEFAULT_RESERVE),
        default_attempt_timeout=value(conf.DEFAULT_ATTEMPT_TIMEOUT),
        max_budget=value(conf.MAX_BUDGET),
        lease_ttl=value(conf.LEASE_TTL),
        lease_ttl_set=lease_ttl_set,
        ledger=value(conf.LEDGER),
        trusted_proxies=value(conf.TRUSTED_PROXIES),
        name=name,
    )


#: Celery's task options it keeps only on the task's class (``Task`` has no such
#: attribute): never a misspelled option of this package's.
CELERY_CLASS_OPTIONS: Final = frozenset(
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


def task_attributes(tasks: Iterable[Any] = ()) -> frozenset[str]:
    """Every attribute a task has as a Celery task or a DeadlineTask (the classes of
    Celery and of this package in each of ``tasks``' classes): never a typo."""
    from celery import Task

    own = frozenset(
        name
        for task in tasks
        for cls in type(task).__mro__
        if cls.__module__.split(".", 1)[0] in {"celery", "celery_deadlines"}
        for name in dir(cls)
    )
    return frozenset(dir(Task)) | frozenset(dir(AttemptAPI)) | own | CELERY_CLASS_OPTIONS


def contract_problems(problems: Iterable[contract_rules.Problem]) -> list[Problem]:
    """What :func:`celery_deadlines.rules.contracts.review` found, as checks: E005, or
    the warning W002 for a task not registered in the checking process (it may be a
    module not imported there)."""
    return [
        Problem(
            "error" if problem.severity == "error" else "warning",
            "celery_deadlines.E005" if problem.severity == "error" else "celery_deadlines.W002",
            problem.message,
            problem.hint,
            CONTRACT_HOWTO,
        )
        for problem in problems
    ]


def review(app: Any) -> list[Problem]:
    """Every problem of ``app``'s own configuration and tasks that needs no Django,
    named as its configuration spells them: E001, E002, E005 to E009 (and their
    warnings)."""
    settings = settings_for(app)
    problems = bad_values(settings) + unknown_names(app, namespaced=True)
    found = configured(settings, lease_ttl_set=lease_ttl_set(app), name=lambda setting: setting)
    problems += declarations.review_settings(found)
    tasks = dict(app.tasks)
    problems += declarations.review(tasks, found, known_attributes=task_attributes(tasks.values()))
    if found.contracts is not UNKNOWN and found.contracts:
        problems += contract_problems(
            contract_rules.review(
                found.contracts,
                tasks,
                str(app.conf.broker_url or ""),
                app.conf.broker_transport_options or {},
                setting=conf.CONTRACTS.name,
            )
        )
    return problems


# -- the refusal ---------------------------------------------------------------------------------

#: The Django project's system checks, once its Django app is ready (set by ``apps.py``):
#: every error of this package's checks, and of those it is handed, that the project
#: does not silence (``SILENCED_SYSTEM_CHECKS``).
SystemChecks: TypeAlias = Callable[[Sequence[Finding]], Sequence[Finding]]
_system_checks: SystemChecks | None = None


def use_system_checks(errors: SystemChecks | None) -> None:
    """Check a Django project's workers with ``errors`` (its system checks' errors)."""
    global _system_checks
    _system_checks = errors


def errors_of(app: Any) -> list[Finding]:
    """Every error that stops ``app``'s worker or beat, each once, in the order found."""
    if _system_checks is not None:
        # the project's checks, with what is set on the Celery app itself, which they
        # do not all read (a value given to app.conf.update, say)
        own = bad_values(settings_for(app)) + unknown_names(app, namespaced=False)
        found = list(_system_checks([finding(problem) for problem in own]))
    else:
        found = [finding(problem) for problem in review(app) if problem.severity == "error"]
    return list(dict.fromkeys(found))


def refusal(what: str, errors: Sequence[Finding]) -> str:
    """What a worker or beat that will not start writes: each error as the check does."""
    count = "1 error" if len(errors) == 1 else f"{len(errors)} errors"
    fix = "it" if len(errors) == 1 else "each"
    return "\n".join(
        [
            f"celery-deadlines: {what} not started: {count} in the library's configuration; "
            f"fix {fix} and start again.",
            *(str(error) for error in errors),
        ]
    )


def refuse_if_misconfigured(app: Any, what: str) -> None:
    """Exit (``SystemExit``, status 1) with :func:`refusal` when ``app`` has an error."""
    errors = errors_of(app)
    if errors:
        raise SystemExit(refusal(what, errors))


def _worker_init(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None:
        refuse_if_misconfigured(app, f"worker {getattr(sender, 'hostname', '')}".rstrip())


def _beat_init(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None:
        refuse_if_misconfigured(app, "beat")


def connect() -> None:
    """Connect the check to worker_init and beat_init (idempotent; :func:`install`)."""
    worker_init.connect(
        _worker_init, dispatch_uid="celery_deadlines.core.preflight.worker", weak=False
    )
    beat_init.connect(_beat_init, dispatch_uid="celery_deadlines.core.preflight.beat", weak=False)
