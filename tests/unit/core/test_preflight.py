"""A worker or beat of a plain Celery app refuses to start on a configuration the
library's checks reject (celery_deadlines.core.preflight), and says what the checks say.

Celery's own start-up code runs here (a ``WorkController`` built, beat's ``Service``
started) on the memory broker; the real ``celery worker`` and ``celery beat`` processes,
Django's settings among them: tests/integration/core/test_preflight.py. Django
projects' workers: tests/django/core/test_preflight.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from celery import Celery, beat
from celery import _state as celery_state
from celery.beat import Service
from celery.signals import beat_init, import_modules, worker_init
from celery.worker import WorkController

from celery_deadlines import ConfigurationError, DeadlineTask, install
from celery_deadlines.conf import LEASE_TTL, Settings
from celery_deadlines.core import preflight


@pytest.fixture
def app() -> Iterator[Celery]:
    """A plain Celery app with the tasks its test defines alone: without Celery's Django
    fixup (see :func:`only_the_check`), and finalized without the shared tasks other
    modules of the session defined (Celery adds every one to every app it finalizes, and
    the checks would report theirs too)."""
    app = Celery("plain", broker="memory://", backend="cache+memory://", fixups=[])
    with mock.patch.object(celery_state, "_on_app_finalizers", set()):
        app.finalize()
    app.set_current()
    app.conf.deadlines_ledger = False
    yield app
    app.close()


@pytest.fixture(autouse=True)
def plain_celery() -> Iterator[None]:
    """No Django project's checks: the process of a plain Celery app (the suite's own
    Django app registered them at its start)."""
    before = preflight._system_checks
    preflight.use_system_checks(None)
    install()
    yield
    preflight.use_system_checks(before)


@pytest.fixture
def only_the_check() -> Iterator[None]:
    """``worker_init`` and ``beat_init`` with the check's receivers alone: the others act
    on the whole process (the pool flag, the time-limit patch, Celery's Django fixup),
    which a unit test must not change for the tests after it. And no ``import_modules``
    receiver: the Django fixup of every app made in this process answers it for any
    worker, and Celery 5.5's and 5.6's run Django's model checks, which read the
    database."""
    signals = (worker_init, beat_init, import_modules)
    saved = [list(signal.receivers) for signal in signals]
    for signal in signals:
        signal.receivers = []
        signal.sender_receivers_cache.clear()  # type: ignore[attr-defined]
    preflight.connect()
    try:
        yield
    finally:
        for signal, receivers in zip(signals, saved, strict=True):
            signal.receivers = receivers
            signal.sender_receivers_cache.clear()  # type: ignore[attr-defined]


def ids(app: Celery) -> list[str]:
    return [error.id for error in preflight.errors_of(app)]


def test_a_bad_value_is_the_error_its_setting_raises_named_in_both_spellings(app: Celery) -> None:
    app.conf.deadlines_lease_ttl = "30s"
    [error] = preflight.errors_of(app)
    with pytest.raises(ConfigurationError) as raised:
        Settings({"deadlines_lease_ttl": "30s"}).get(LEASE_TTL)
    assert error.id == "celery_deadlines.E001"
    assert error.message == str(raised.value)
    assert "deadlines_lease_ttl (Django: CELERY_DEADLINES_LEASE_TTL)" in error.message
    assert "must be a number of seconds or a timedelta, got str '30s'" in error.message
    assert error.hint == 'Documentation: "Settings reference" > "CELERY_DEADLINES_LEASE_TTL".'
    assert str(error) == f"(celery_deadlines.E001) {error.message}\n\tHINT: {error.hint}"


def test_a_misspelled_setting_name_is_an_error_naming_the_setting_it_likely_meant(
    app: Celery,
) -> None:
    app.conf.deadlines_leese_ttl = 5
    [error] = preflight.errors_of(app)
    assert error.id == "celery_deadlines.E002"
    assert error.message == (
        "deadlines_leese_ttl (set on the Celery app) is not a celery-deadlines setting."
    )
    assert error.hint.startswith("Did you mean deadlines_lease_ttl? ")


def test_a_misspelled_name_in_a_namespaced_configuration_is_named_as_it_is_spelled() -> None:
    app = Celery("namespaced", broker="memory://", set_as_current=False)
    app.config_from_object(
        SimpleNamespace(CELERY_DEADLINES_LEESE_TTL=5, CELERY_DEADLINES_LEASE_TTL=20),
        namespace="CELERY",
    )
    [error] = preflight.errors_of(app)
    assert error.message.startswith("CELERY_DEADLINES_LEESE_TTL (set on the Celery app)")
    assert error.hint.startswith("Did you mean CELERY_DEADLINES_LEASE_TTL? ")


def test_a_tasks_bad_option_and_defaults_that_cannot_work_together_are_errors(
    app: Celery,
) -> None:
    @app.task(base=DeadlineTask, name="u.negative", budget=-3, shared=False)
    def negative() -> None:
        pass

    app.conf.deadlines_default_budget = 10
    app.conf.deadlines_default_reserve = 10
    assert sorted(ids(app)) == ["celery_deadlines.E006", "celery_deadlines.E008"]
    [e008] = [error for error in preflight.errors_of(app) if error.id.endswith("E008")]
    assert e008.message.startswith("deadlines_default_reserve (10 s)")  # as the app spells it


def test_a_contract_that_does_not_fit_its_task_is_an_error(app: Celery) -> None:
    @app.task(base=DeadlineTask, name="u.twice", budget=20, shared=False)
    def twice() -> None:
        pass

    app.conf.deadlines_contracts = {"u.twice": {"budget": 30}}  # set twice: which one?
    [error] = preflight.errors_of(app)
    assert error.id == "celery_deadlines.E005"
    assert (
        error.message
        == "deadlines_contracts['u.twice'].budget is also set on the task itself (20)."
    )


def test_warnings_stop_nothing(app: Celery) -> None:
    @app.task(base=DeadlineTask, name="u.misspelled", budgte=10, shared=False)
    def misspelled() -> None:  # W006: budgte
        pass

    app.conf.deadlines_contracts = {"u.nowhere": {"budget": 30}}  # W002: no such task
    found = preflight.review(app)
    assert {problem.id for problem in found} == {"celery_deadlines.W006", "celery_deadlines.W002"}
    assert preflight.errors_of(app) == []


class BlueprintReached(Exception):
    """Raised where a worker goes on after ``worker_init``: its steps, its pool."""


class Worker(WorkController):
    """Celery's worker, built no further than ``worker_init`` and the check."""

    def on_init_blueprint(self) -> None:
        raise BlueprintReached


@pytest.mark.usefixtures("only_the_check")
def test_a_worker_of_a_bad_configuration_exits_before_its_pool_exists(app: Celery) -> None:
    app.conf.deadlines_lease_ttl = "30s"
    with pytest.raises(SystemExit) as exited:
        Worker(app=app, hostname="w1@host", pool_cls="solo")  # not BlueprintReached
    message = str(exited.value.code)
    assert message.startswith(
        "celery-deadlines: worker w1@host not started: 1 error in the library's configuration"
    )
    [error] = preflight.errors_of(app)
    assert message.endswith("\n" + str(error))


@pytest.mark.usefixtures("only_the_check")
def test_a_worker_of_a_good_configuration_goes_on_to_build_its_pool(app: Celery) -> None:
    app.conf.deadlines_lease_ttl = 30
    with pytest.raises(BlueprintReached):
        Worker(app=app, hostname="w2@host", pool_cls="solo")


@pytest.mark.usefixtures("only_the_check")
def test_the_exit_passes_through_celerys_signal_dispatch_which_keeps_every_exception(
    app: Celery,
) -> None:
    app.conf.deadlines_lease_ttl = "30s"

    class Sender:  # what worker_init is sent by: the worker, with its app
        hostname = "w3@host"

        def __init__(self, app: Celery) -> None:
            self.app = app

    with pytest.raises(SystemExit):
        worker_init.send(sender=Sender(app))


@pytest.mark.usefixtures("only_the_check")
def test_beat_of_a_bad_configuration_exits_before_it_sends_anything(app: Celery) -> None:
    app.conf.deadlines_lease_ttl = "30s"
    app.conf.beat_schedule = {"tick": {"task": "u.tick", "schedule": 0.01}}
    ticks: list[None] = []

    class Scheduler(beat.Scheduler):
        def tick(self, *args: Any, **kwargs: Any) -> float:
            ticks.append(None)
            return 0.0

    with pytest.raises(SystemExit) as exited:
        Service(app=app, scheduler_cls=Scheduler).start()
    assert ticks == []
    assert str(exited.value.code).startswith("celery-deadlines: beat not started: 1 error")


def test_every_error_is_written_once_in_the_order_found(app: Celery) -> None:
    app.conf.deadlines_lease_ttl = "30s"
    app.conf.deadlines_max_lost_leases = -1
    app.conf.deadlines_leese_ttl = 1
    errors = preflight.errors_of(app)
    assert [error.id for error in errors] == [
        "celery_deadlines.E001",
        "celery_deadlines.E001",
        "celery_deadlines.E002",
    ]
    text = preflight.refusal("beat", errors)
    assert text.splitlines()[0] == (
        "celery-deadlines: beat not started: 3 errors in the library's configuration; "
        "fix each and start again."
    )
    assert all(text.count(str(error)) == 1 for error in errors)
