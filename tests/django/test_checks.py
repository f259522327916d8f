"""The Django tier: system checks name the setting to fix; settings changes take effect."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core import checks
from django.core.management import call_command
from django.test import override_settings

from celery_deadlines import ConfigurationError
from celery_deadlines.checks import check_contracts, check_ingress, check_settings
from celery_deadlines.conf import DEFAULT_BUDGET, settings_for

pytestmark = pytest.mark.usefixtures("json_support_known")


@pytest.fixture(autouse=True)
def the_projects_app_is_current() -> Iterator[None]:
    """The checks read Celery's current app, which a project makes its own at start (its
    package imports its Celery app); a test run earlier in this process may have made
    another app current since."""
    from celery import _state

    from demo_project.celery import app

    previous = _state.get_current_app()
    app.set_current()
    yield
    previous.set_current()


def errors() -> list[checks.CheckMessage]:
    return check_settings(None)


def test_the_demo_settings_pass_the_checks() -> None:
    assert errors() == []
    assert check_ingress(None) == []  # no request deadline asked for, no middleware


@pytest.mark.parametrize(
    ("name", "value", "complaint"),
    [
        ("CELERY_DEADLINES_DEFAULT_BUDGET", "30s", "must be a number of seconds or a timedelta"),
        ("CELERY_DEADLINES_DEFAULT_BUDGET", -5, "more than zero"),
        ("CELERY_DEADLINES_DEFAULT_RESERVE", float("nan"), "finite"),
        ("CELERY_DEADLINES_BUDGETS", ["shop.charge"], "must map task names"),
        ("CELERY_DEADLINES_BUDGETS", {"shop.charge": timedelta(days=30)}, "maximum budget"),
        ("CELERY_DEADLINES_MAX_BUDGET", 0, "more than zero"),
        (
            "CELERY_DEADLINES_CONTRACTS",
            {"shop.tasks.change_address": {"budget": 60, "lease_ttl": 90}},
            "lease_ttl (90 s) is longer than its budget (60 s)",
        ),
        ("CELERY_DEADLINES_CONTRACTS", {"shop.x": {"timeout": 5}}, "unknown key(s) timeout"),
        ("CELERY_DEADLINES_WORKFLOW_CHECK", "strict", "one of 'refuse', 'warn', 'off'"),
        ("CELERY_DEADLINES_WORKFLOW_CHECK", True, "one of 'refuse', 'warn', 'off'"),
        # a negative reserve would let a call outlive the deadline
        ("CELERY_DEADLINES_OUTBOUND_RESERVE", -0.5, "must be zero or more seconds"),
        ("CELERY_DEADLINES_OUTBOUND_HEADERS", {"X-Deadline": "iso8601"}, "must be one of"),
        ("CELERY_DEADLINES_OUTBOUND_HEADERS", "grpc-timeout", "must map header names"),
        # one alias is a list of one: a string would be read as its letters
        ("CELERY_DEADLINES_DATABASE_CAP", "default", "True, False or a list of database"),
        ("CELERY_DEADLINES_DATABASE_CAP", 0, "True, False or a list of database"),
        ("CELERY_DEADLINES_DATABASE_CAP", ["default", None], "None is not an alias"),
    ],
)
def test_a_bad_value_is_an_error_that_names_the_setting(
    name: str, value: Any, complaint: str
) -> None:
    with override_settings(**{name: value}):
        found = errors()
    assert [message.id for message in found] == ["celery_deadlines.E001"]
    assert name in found[0].msg
    assert complaint in found[0].msg


@pytest.mark.parametrize("port", [-1, 70000, "9808", 9808.5])
def test_a_metrics_port_that_is_not_a_tcp_port_is_a_check_error_naming_the_setting(
    port: object,
) -> None:
    with override_settings(CELERY_DEADLINES_METRICS_PORT=port):
        found = errors()
    assert [message.id for message in found] == ["celery_deadlines.E001"]
    assert "CELERY_DEADLINES_METRICS_PORT" in found[0].msg
    assert "a TCP port from 1 to 65535" in found[0].msg


def test_a_metrics_port_passes_the_checks() -> None:
    with override_settings(CELERY_DEADLINES_METRICS_PORT=9808):
        assert errors() == []


def test_a_misspelled_setting_is_an_error_suggesting_the_closest_name() -> None:
    with override_settings(CELERY_DEADLINES_DEFAULT_BUGDET=30):
        found = errors()
    assert [message.id for message in found] == ["celery_deadlines.E002"]
    assert "CELERY_DEADLINES_DEFAULT_BUGDET" in found[0].msg
    assert (found[0].hint or "").startswith("Did you mean CELERY_DEADLINES_DEFAULT_BUDGET? ")


def test_a_misspelled_setting_on_the_celery_app_is_an_error_suggesting_the_closest_name() -> None:
    from celery import current_app

    current_app.conf.deadlines_retenton = 3600
    try:
        found = errors()
    finally:
        del current_app.conf["deadlines_retenton"]
    assert [message.id for message in found] == ["celery_deadlines.E002"]
    assert "deadlines_retenton (set on the Celery app)" in found[0].msg
    assert (found[0].hint or "").startswith("Did you mean deadlines_retention? ")
    assert errors() == []


def test_an_unknown_setting_like_none_is_an_error_listing_the_known_ones() -> None:
    with override_settings(CELERY_DEADLINES_COLOUR="blue"):
        [found] = errors()
    assert found.id == "celery_deadlines.E002"
    assert "Known settings: CELERY_DEADLINES_BACKLOG_REFUSAL, CELERY_DEADLINES_BUDGETS, " in (
        found.hint or ""
    )
    assert "CELERY_DEADLINES_DEFAULT_BUDGET" in (found.hint or "")


@pytest.mark.django_db  # model checks may ask the database (JSONField support) first
def test_manage_py_check_fails_on_a_bad_setting() -> None:
    from django.core.management.base import SystemCheckError

    with (
        override_settings(CELERY_DEADLINES_DEFAULT_BUDGET="soon"),
        pytest.raises(SystemCheckError, match="CELERY_DEADLINES_DEFAULT_BUDGET"),
    ):
        call_command("check")


def test_override_settings_reaches_the_celery_app_at_once() -> None:
    from demo_project.celery import app

    settings = settings_for(app)
    assert settings.get(DEFAULT_BUDGET) is None
    with override_settings(CELERY_DEADLINES_DEFAULT_BUDGET=12):
        assert settings.get(DEFAULT_BUDGET) == timedelta(seconds=12)
    assert settings.get(DEFAULT_BUDGET) is None


def test_a_bad_setting_read_through_celery_raises_naming_the_django_name() -> None:
    from demo_project.celery import app

    with (
        override_settings(CELERY_DEADLINES_DEFAULT_BUDGET="soon"),
        pytest.raises(ConfigurationError, match="CELERY_DEADLINES_DEFAULT_BUDGET"),
    ):
        settings_for(app).get(DEFAULT_BUDGET)


@pytest.mark.django_db
def test_the_app_needs_no_migrations_yet() -> None:
    call_command("makemigrations", "celery_deadlines", "--check", "--dry-run", verbosity=0)


def test_a_ledger_database_alias_that_does_not_exist_is_named() -> None:
    from celery_deadlines.checks import check_ledger_database

    with override_settings(CELERY_DEADLINES_DATABASE="ledger"):
        [error] = check_ledger_database(None)
    assert error.id == "celery_deadlines.E003"
    assert "CELERY_DEADLINES_DATABASE names 'ledger'" in error.msg


def test_the_ledger_needs_aware_datetimes() -> None:
    from celery_deadlines.checks import check_ledger_database

    with override_settings(USE_TZ=False):
        [error] = check_ledger_database(None)
    assert error.id == "celery_deadlines.E004"
    assert "USE_TZ" in error.msg


def test_a_ledger_alias_without_autocommit_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import connections

    from celery_deadlines.checks import check_ledger_database

    manual = {**connections.settings["default"], "AUTOCOMMIT": False}
    monkeypatch.setitem(connections.settings, "default", manual)
    [error] = check_ledger_database(None)
    assert error.id == "celery_deadlines.E010"
    assert "DATABASES['default'] sets AUTOCOMMIT = False" in error.msg


def test_the_test_settings_pass_the_ledger_checks() -> None:
    from celery_deadlines.checks import check_ledger_database

    assert check_ledger_database(None) == []


@pytest.mark.parametrize(
    "settings_module",
    ["demo_project.settings", "tests.support.ledger_settings"],
    ids=["BigAutoField", "AutoField"],
)
def test_the_migrations_match_the_models_whatever_the_projects_default_auto_field(
    settings_module: str, tmp_path: Any
) -> None:
    import os
    import subprocess
    import sys

    from tests.support.processes import REPO

    completed = subprocess.run(
        [sys.executable, "-m", "django", "makemigrations", "--check", "--dry-run",
         "celery_deadlines"],
        cwd=REPO,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": settings_module,
            "DEMO_VAR_DIR": str(tmp_path),
            "TEST_DATABASE_URL": f"sqlite:///{tmp_path / 'check.sqlite3'}",
            "PYTHONPATH": str(REPO),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "No changes detected" in completed.stdout


def test_a_contract_that_does_not_fit_its_task_is_an_error_and_an_unknown_task_a_warning() -> None:
    import demo_project.shop.tasks as shop

    contracts = {
        shop.charge_card.name: {"budget": 30, "attempt_timeout": 3},  # also set on the task
        "demo_project.shop.tasks.chrage_card": {"budget": 30},  # a typo
    }
    with override_settings(CELERY_DEADLINES_CONTRACTS=contracts):
        found = check_contracts(None)
    assert [message.id for message in found] == ["celery_deadlines.E005", "celery_deadlines.W002"]
    assert f"CELERY_DEADLINES_CONTRACTS[{shop.charge_card.name!r}].attempt_timeout" in found[0].msg
    assert "names no registered task" in found[1].msg
    with override_settings(CELERY_DEADLINES_CONTRACTS={shop.print_label.name: {"budget": 30}}):
        assert check_contracts(None) == []


def test_checking_the_contracts_loads_the_tasks_without_running_every_check_again() -> None:
    """Loading the tasks sends Celery's ``import_modules`` signal, which Celery's Django
    fixup answers by running every system check: this check included, so it loaded again,
    some 160 levels deep until a RecursionError (a prefork worker then started with 2 of
    the demo's 9 tasks)."""
    from celery import signals

    import demo_project.shop.tasks as shop

    sent: list[object] = []

    def count(sender: object = None, **kwargs: object) -> None:
        sent.append(sender)

    signals.import_modules.connect(count, weak=False)
    try:
        with override_settings(CELERY_DEADLINES_CONTRACTS={shop.print_label.name: {"budget": 30}}):
            assert check_contracts(None) == []
    finally:
        signals.import_modules.disconnect(count)
    assert len(sent) == 1
    assert "CELERY_SKIP_CHECKS" not in os.environ  # the fixup's switch is put back


def hints_of_every_check() -> dict[str, str]:
    """One message of each check id, by id, with its hint."""
    import demo_project.shop.tasks as shop
    from celery_deadlines.checks import (
        _cannot_check,
        check_database_cap,
        check_ingress,
        check_ledger_database,
        check_retention,
    )

    found: list[checks.CheckMessage] = [_cannot_check("for the test")]
    with override_settings(CELERY_DEADLINES_DEFAULT_BUDGET="soon", CELERY_DEADLINES_DEFALT=1):
        found += errors()
    with override_settings(CELERY_DEADLINES_COLOUR="blue"):
        found += errors()
    contracts = {shop.charge_card.name: {"attempt_timeout": 3}, "shop.nothing": {"budget": 1}}
    with override_settings(CELERY_DEADLINES_CONTRACTS=contracts):
        found += check_contracts(None)
    with override_settings(CELERY_DEADLINES_RETENTION=60):
        found += check_retention(None)
    with override_settings(CELERY_DEADLINES_DATABASE="ledger", USE_TZ=False):
        found += check_ledger_database(None)
    from unittest import mock

    from django.db import connections

    manual = {**connections.settings["default"], "AUTOCOMMIT": False}
    with mock.patch.dict(connections.settings, {"default": manual}):
        found += check_ledger_database(None)
    with override_settings(
        CELERY_DEADLINES_REQUEST_HEADERS={"grpc-timeout": "grpc-timeout"}, MIDDLEWARE=[]
    ):
        found += check_ingress(None)
    pgbouncer = {
        **connections.settings["default"],
        "ENGINE": "django.db.backends.postgresql",
        "PORT": 6432,
    }
    try:
        with mock.patch.dict(connections.settings, {"pgbouncer": pgbouncer}):
            found += check_database_cap()
    finally:
        del connections["pgbouncer"]
    return {f"{m.id}:{i}": m.hint or "" for i, m in enumerate(found)}


def test_every_check_hint_names_a_section_of_the_docs_not_a_repository_path() -> None:
    import re

    from tests.support.doc_pages import pages_by_title

    pages = pages_by_title()
    hints = hints_of_every_check()
    ids = {key.split(":")[0] for key in hints}
    every = ["E001", "E002", "E003", "E004", "E005", "E010"]
    every += ["W001", "W002", "W003", "W004", "W005", "W013"]
    assert ids == {f"celery_deadlines.{n}" for n in every}
    for key, hint in hints.items():
        assert "docs/" not in hint, (key, hint)
        assert ".md" not in hint, (key, hint)
        where = re.search(r'Documentation: "([^"]+)" > "([^"]+)"\.$', hint)
        assert where, (key, hint)
        page, section = where.groups()
        assert page in pages, (key, hint)
        headings = re.findall(r"^#{2,4} (.+)$", pages[page], re.M)
        assert section in headings or f"`{section}`" in pages[page], (key, hint)


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("deadlines_default_bugdet", "deadlines_default_budget"),
        ("deadlines_retenton", "deadlines_retention"),
        ("deadlines_resrve", "deadlines_default_reserve"),
        ("deadlines_lease", "deadlines_lease_ttl"),
        ("deadlines_max_budgets", "deadlines_max_budget"),
        ("deadlines_colour", None),
    ],
)
def test_the_closest_setting_is_the_one_a_typo_most_likely_meant(
    typo: str, meant: str | None
) -> None:
    from celery_deadlines.checks import closest_setting

    assert closest_setting(typo) == meant


def test_a_database_cap_naming_an_alias_databases_does_not_have_is_a_warning() -> None:
    from django.core import checks as django_checks

    from celery_deadlines.checks import check_database_cap

    with override_settings(CELERY_DEADLINES_DATABASE_CAP=["default", "replica"]):
        found = check_database_cap()
    assert [message.id for message in found] == ["celery_deadlines.W011"]
    assert "'replica', which is not in DATABASES" in found[0].msg
    assert found[0].level == django_checks.WARNING
    with override_settings(CELERY_DEADLINES_DATABASE_CAP=True):
        assert check_database_cap() == []


@pytest.mark.parametrize(
    ("port", "disable_cursors", "cap", "warned"),
    [
        (6432, False, True, True),  # PgBouncer's port, capped by default
        ("6432", False, ["pgbouncer"], True),
        (6432, True, True, False),  # the transaction's form only: nothing outlives it
        (6432, False, False, False),  # not capped
        (6432, False, ["default"], False),  # not this alias
        (5432, False, True, False),  # PostgreSQL's own port
    ],
)
def test_a_capped_postgresql_alias_on_pgbouncers_port_needs_disable_server_side_cursors(
    port: Any, disable_cursors: bool, cap: Any, warned: bool
) -> None:
    from unittest import mock

    from django.db import connections

    from celery_deadlines.checks import check_database_cap

    alias = {
        **connections.settings["default"],
        "ENGINE": "django.db.backends.postgresql",
        "PORT": port,
        "DISABLE_SERVER_SIDE_CURSORS": disable_cursors,
    }
    try:
        with (
            mock.patch.dict(connections.settings, {"pgbouncer": alias}),
            override_settings(CELERY_DEADLINES_DATABASE_CAP=cap),
        ):
            found = [m for m in check_database_cap() if m.id == "celery_deadlines.W013"]
    finally:
        with contextlib.suppress(AttributeError):  # made only if the check looked at it
            del connections["pgbouncer"]
    assert len(found) == warned, found
    if warned:
        assert "Database 'pgbouncer' connects to port 6432, PgBouncer's" in found[0].msg
        assert "DISABLE_SERVER_SIDE_CURSORS" in (found[0].hint or "")
