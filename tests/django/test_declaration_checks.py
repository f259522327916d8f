"""``manage.py check`` finds what the project's tasks declare wrong (E006 to E009, W006
to W010), before the first publish does, or never does. Each test declares one mistake on
the demo's Celery app and runs Django's checks as ``manage.py check`` runs them."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.core import checks
from django.core.management import call_command
from django.test import override_settings

from celery_deadlines import DeadlineTask

pytestmark = pytest.mark.usefixtures("json_support_known")

DECLARED = "tests.declared"
_numbers = itertools.count()


@pytest.fixture(autouse=True)
def the_projects_app_is_current() -> Iterator[None]:
    """The checks read Celery's current app, which a project makes its own at start (as
    in tests/django/test_checks.py)."""
    from celery import _state

    from demo_project.celery import app

    previous = _state.get_current_app()
    app.set_current()
    yield
    previous.set_current()


@contextmanager
def declared(**task_options: Any) -> Iterator[str]:
    """A DeadlineTask declared on the demo's app with ``task_options``, as
    ``@app.task(base=DeadlineTask, ...)`` declares one; its name. Unregistered after."""
    from demo_project.celery import app

    name = f"{DECLARED}.task_{next(_numbers)}"

    def body() -> None:  # pragma: no cover (never run)
        return None

    app.tasks  # noqa: B018 (finalizes the app: the decorator then registers at once)
    task: Any = app.task  # (its overloads take no **options)
    task(base=DeadlineTask, name=name, shared=False, **task_options)(body)
    try:
        yield name
    finally:
        app.tasks.pop(name, None)


OURS = {f"celery_deadlines.E{n:03d}" for n in range(6, 10)} | {
    f"celery_deadlines.W{n:03d}" for n in range(6, 11)
}


def found(*, only: str | None = None) -> list[checks.CheckMessage]:
    """What ``manage.py check`` reports of the declaration checks (``only``: one id)."""
    return [
        message
        for message in checks.run_checks()
        if message.id in OURS and (only is None or message.id == f"celery_deadlines.{only}")
    ]


def one(only: str) -> checks.CheckMessage:
    [message] = found(only=only)
    return message


def test_the_demo_projects_tasks_declare_nothing_wrong() -> None:
    """print_label's budget (3 s, CELERY_DEADLINES_BUDGETS) is shorter than the
    package's default lease (30 s), which the demo does not set: no warning."""
    assert found() == []


def test_a_task_declared_with_a_negative_budget_is_an_error_naming_task_and_option() -> None:
    with declared(budget=-3) as name:
        message = one("E006")
    assert isinstance(message, checks.Error)
    assert f"task {name!r} option budget must be more than zero seconds, got -3" in message.msg
    assert "would raise InvalidDeadline" in message.msg
    assert (message.hint or "").endswith('Documentation: "Settings reference" > "Task options".')


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("budget", float("nan")),
        ("budget", "30s"),
        ("delivery_budget", 0),
        ("reserve", -1),
        ("attempt_timeout", True),
        ("lease_ttl", None),
        ("lease_ttl", 1e300),
    ],
)
def test_every_time_option_with_a_bad_value_is_an_error(option: str, value: object) -> None:
    with declared(**{option: value}) as name:
        message = one("E006")
    assert f"task {name!r} option {option}" in message.msg


@pytest.mark.django_db  # model checks may ask the database (JSONField support) first
def test_manage_py_check_fails_on_a_task_declared_with_a_bad_budget() -> None:
    from django.core.management.base import SystemCheckError

    with (
        declared(budget=-3) as name,
        pytest.raises(SystemCheckError, match=re.escape(f"task {name!r} option budget")),
    ):
        call_command("check")


def test_a_reserve_that_eats_the_tasks_budget_is_an_error() -> None:
    with declared(budget=5, reserve=5) as name:
        message = one("E007")
    assert f"task {name!r}: its reserve (5 s, task option) leaves nothing of its budget" in (
        message.msg
    )


def test_an_attempt_timeout_longer_than_the_tasks_budget_is_an_error() -> None:
    with declared(budget=5, attempt_timeout=8, lease_ttl=1) as name:
        message = one("E007")
    assert f"task {name!r}: its attempt_timeout (8 s, task option) is longer than" in message.msg


def test_a_misspelled_task_option_is_a_warning_naming_the_option_meant() -> None:
    with declared(budgte=10) as name:
        message = one("W006")
    assert isinstance(message, checks.Warning)
    assert f"task {name!r} has the attribute budgte = 10" in message.msg
    assert "did you mean budget?" in message.msg
    assert (message.hint or "").startswith("Rename the option budgte to budget")


def test_a_budgets_entry_naming_no_registered_task_is_a_warning() -> None:
    budgets = {"demo_project.shop.tasks.print_label": 3, "demo_project.shop.tasks.prnt": 3}
    with override_settings(CELERY_DEADLINES_BUDGETS=budgets):
        message = one("W007")
    assert "CELERY_DEADLINES_BUDGETS['demo_project.shop.tasks.prnt'] names no registered task" in (
        message.msg
    )


def test_a_budgets_entry_the_tasks_own_budget_overrides_is_a_warning() -> None:
    with declared(budget=60) as name, override_settings(CELERY_DEADLINES_BUDGETS={name: 3}):
        message = one("W008")
    assert f"CELERY_DEADLINES_BUDGETS[{name!r}] has no effect" in message.msg
    assert "sets its own budget (60)" in message.msg


def test_a_default_reserve_as_long_as_the_default_budget_is_an_error() -> None:
    with override_settings(CELERY_DEADLINES_DEFAULT_BUDGET=2, CELERY_DEADLINES_DEFAULT_RESERVE=2):
        message = one("E008")
    assert "CELERY_DEADLINES_DEFAULT_RESERVE (2 s) leaves nothing of " in message.msg
    assert (message.hint or "").endswith('"CELERY_DEADLINES_DEFAULT_RESERVE".')


def test_a_maximum_budget_below_a_tasks_budget_is_an_error_naming_both() -> None:
    with (
        declared(budget=timedelta(hours=2)) as name,
        override_settings(CELERY_DEADLINES_MAX_BUDGET=3600),
    ):
        message = one("E009")
    assert f"task {name!r} option budget (7200 s) is longer than CELERY_DEADLINES_MAX_BUDGET" in (
        message.msg
    )


def test_a_lease_setting_longer_than_a_tasks_budget_is_a_warning() -> None:
    with declared(budget=10) as name, override_settings(CELERY_DEADLINES_LEASE_TTL=60):
        [message] = [m for m in found(only="W009") if name in m.msg]
    assert f"task {name!r}: its lease (60 s, CELERY_DEADLINES_LEASE_TTL) is longer" in (message.msg)
    with declared(budget=10, lease_ttl=3) as name:
        assert [m for m in found(only="W009") if name in m.msg] == []


def test_a_short_budget_under_the_packages_default_lease_is_no_warning() -> None:
    with declared(budget=10) as name:  # the default lease (30 s) is not the project's
        assert [m for m in found(only="W009") if name in m.msg] == []
    with declared(budget=10, lease_ttl=60) as name:  # a lease the task declares is
        assert [m for m in found(only="W009") if name in m.msg] != []


@pytest.mark.parametrize("network", ["0.0.0.0/0", "::/0"])
def test_a_trusted_proxy_network_that_holds_every_address_is_a_warning(network: str) -> None:
    with override_settings(CELERY_DEADLINES_TRUSTED_PROXIES=["10.0.0.0/8", network]):
        message = one("W010")
    assert f"CELERY_DEADLINES_TRUSTED_PROXIES trusts {network} (every address" in message.msg


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("CELERY_DEADLINES_DEFAULT_BUDGET", "soon"),
        ("CELERY_DEADLINES_MAX_BUDGET", -1),
        ("CELERY_DEADLINES_LEASE_TTL", "30"),
        ("CELERY_DEADLINES_BUDGETS", ["demo_project.shop.tasks.print_label"]),
    ],
)
def test_nothing_is_checked_against_a_setting_that_is_bad_itself_which_e001_reports(
    setting: str, value: Any
) -> None:
    with declared(budget=60, reserve=1, budgte=1) as name, override_settings(**{setting: value}):
        everything = checks.run_checks()
    assert "celery_deadlines.E001" in [message.id for message in everything]
    # what does not need the bad setting is still checked: only the typo is reported
    assert [m.id for m in everything if m.id in OURS and name in m.msg] == ["celery_deadlines.W006"]


def test_without_the_projects_celery_app_the_tasks_cannot_be_checked() -> None:
    from celery import Celery

    from celery_deadlines.checks import check_declarations

    fallback = Celery("default", loader="default", set_as_current=True)  # as Celery's own
    [message] = check_declarations(None)
    assert message.id == "celery_deadlines.W001"
    assert "The options of the project's tasks could not be checked" in message.msg
    fallback.close()


def test_every_declaration_hint_names_a_section_of_the_docs() -> None:
    from tests.support.doc_pages import pages_by_title

    pages = pages_by_title()
    # each mistake: its task options, and its settings (from the task's name)
    mistakes: list[tuple[dict[str, Any], Callable[[str], dict[str, Any]]]] = [
        ({"budget": -3}, lambda name: {}),
        ({"budget": 5, "reserve": 5}, lambda name: {}),
        ({"budgte": 5}, lambda name: {}),
        ({}, lambda name: {"CELERY_DEADLINES_BUDGETS": {"nothing.here": 3}}),
        ({"budget": 60}, lambda name: {"CELERY_DEADLINES_BUDGETS": {name: 3}}),
        (
            {},
            lambda name: {
                "CELERY_DEADLINES_DEFAULT_BUDGET": 2,
                "CELERY_DEADLINES_DEFAULT_RESERVE": 2,
            },
        ),
        ({"budget": 7200}, lambda name: {"CELERY_DEADLINES_MAX_BUDGET": 3600}),
        ({"budget": 10, "lease_ttl": 60}, lambda name: {}),
        ({}, lambda name: {"CELERY_DEADLINES_TRUSTED_PROXIES": ["0.0.0.0/0"]}),
    ]
    hints: dict[str, str] = {}
    for task_options, settings in mistakes:
        with declared(**task_options) as name, override_settings(**settings(name)):
            hints.update({str(message.id): message.hint or "" for message in found()})
    assert set(hints) == OURS
    for key, hint in hints.items():
        where = re.search(r'Documentation: "([^"]+)" > "([^"]+)"\.$', hint)
        assert where, (key, hint)
        page, section = where.groups()
        headings = re.findall(r"^#{2,4} (.+)$", pages[page], re.M)
        assert section in headings or f"`{section}`" in pages[page], (key, hint)
