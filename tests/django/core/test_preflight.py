"""A Django project's worker or beat refuses to start on every error ``manage.py check``
reports of this package, and on none it silences (celery_deadlines.core.preflight).

The real ``celery worker`` and ``celery beat`` of a Django project:
tests/integration/core/test_preflight.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from celery import Celery
from django.test import override_settings

from celery_deadlines.checks import check_settings
from celery_deadlines.core import preflight


@pytest.fixture
def project() -> Iterator[Celery]:
    """The demo project's app (Django's settings, namespace ``CELERY``), current as a
    project makes it at start."""
    from celery import _state

    from demo_project.celery import app

    previous = _state.get_current_app()
    app.set_current()
    yield app
    previous.set_current()


def test_the_projects_system_checks_decide_what_stops_its_workers() -> None:
    assert preflight._system_checks is not None  # the Django app handed them over


def test_the_demo_project_starts(project: Celery) -> None:
    assert preflight.errors_of(project) == []


def test_a_bad_setting_stops_a_worker_with_the_checks_own_message_once(project: Celery) -> None:
    with override_settings(CELERY_DEADLINES_LEASE_TTL="30s"):
        [checked] = check_settings(None)
        errors = preflight.errors_of(project)
    # the project's check and the app's own settings read the same value: said once
    assert [str(error) for error in errors] == [
        f"(celery_deadlines.E001) {checked.msg}\n\tHINT: {checked.hint}"
    ]
    assert "deadlines_lease_ttl (Django: CELERY_DEADLINES_LEASE_TTL)" in checked.msg


def test_a_misspelled_setting_stops_a_worker(project: Celery) -> None:
    with override_settings(CELERY_DEADLINES_LEASE_TTLL=30):
        [error] = preflight.errors_of(project)
    assert str(error) == (
        "(celery_deadlines.E002) CELERY_DEADLINES_LEASE_TTLL is not a celery-deadlines "
        "setting.\n\tHINT: Did you mean CELERY_DEADLINES_LEASE_TTL? Documentation: "
        '"Settings reference" > "CELERY_DEADLINES_LEASE_TTL".'
    )


def test_an_error_of_the_other_checks_stops_a_worker_too(project: Celery) -> None:
    with override_settings(USE_TZ=False):
        assert [error.id for error in preflight.errors_of(project)] == ["celery_deadlines.E004"]
    with override_settings(CELERY_DEADLINES_DATABASE="elsewhere"):
        assert [error.id for error in preflight.errors_of(project)] == ["celery_deadlines.E003"]


def test_a_silenced_check_stops_nothing(project: Celery) -> None:
    with override_settings(
        CELERY_DEADLINES_LEASE_TTL="30s", SILENCED_SYSTEM_CHECKS=["celery_deadlines.E001"]
    ):
        assert preflight.errors_of(project) == []


def test_a_warning_stops_nothing(project: Celery) -> None:
    with override_settings(CELERY_DEADLINES_RETENTION=timedelta(hours=1)):  # W003
        assert preflight.errors_of(project) == []


def test_a_value_set_on_the_celery_app_itself_stops_its_worker_unless_silenced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An app given its settings in code (``app.conf.update``), not by Django's."""
    from celery import _state

    app = Celery("own", broker="memory://", set_as_current=False)
    # finalized without the session's shared tasks (every task another test declared
    # without shared=False joins each new app): this app's own checks only
    monkeypatch.setattr(_state, "_on_app_finalizers", set())
    app.finalize()
    app.conf.deadlines_lease_ttl = "30s"
    [error] = preflight.errors_of(app)
    assert error.id == "celery_deadlines.E001"
    assert "deadlines_lease_ttl (Django: CELERY_DEADLINES_LEASE_TTL)" in error.message
    with override_settings(SILENCED_SYSTEM_CHECKS=["celery_deadlines.E001"]):
        assert preflight.errors_of(app) == []
