"""Eager runs on the database's ledger, as a developer meets them: a view calling
``.delay()`` under ``CELERY_TASK_ALWAYS_EAGER`` (tests/support/eager_site.py), through
Django's test client, with ``ATOMIC_REQUESTS``, on a developer's SQLite file and on
PostgreSQL.

An eager run is a run in the ledger: recorded, claimed, its effects performed once per
key, its outcome written, and a second call with the same task id (a reloaded page,
another process) is told the run's outcome and performs nothing. On PostgreSQL its
statements are committed on the ledger's own connection, whatever becomes of the
request's transaction; on SQLite, which lets one connection write at a time, they join
the request's transaction.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import Retry
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connections
from django.test import Client, override_settings

from celery_deadlines import DEADLINE_HEADER, DeadlineRefused
from celery_deadlines.clock import get_clock
from celery_deadlines.ledger import api
from celery_deadlines.ledger.heartbeat import heartbeat
from celery_deadlines.models import Effect, Run
from celery_deadlines.rules.wire import encode
from tests.conftest import service_unavailable
from tests.django.conftest import one_database
from tests.support import eager_site
from tests.support.eager_site import provider_calls
from tests.support.processes import reachable, wait_for

REPO = Path(__file__).resolve().parents[2]

#: A developer's SQLite file, and PostgreSQL: each test runs on each.
DATABASES = [one_database("sqlite_file", "sqlite"), one_database("postgres", "postgresql")]


@pytest.fixture(params=DATABASES)
def alias(request: pytest.FixtureRequest) -> str:
    if request.param == "postgres" and not reachable("127.0.0.1", 5432):
        service_unavailable("PostgreSQL 127.0.0.1:5432")
    return str(request.param)


@pytest.fixture
def site(alias: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The eager site on ``alias``, every request in a transaction (``ATOMIC_REQUESTS``),
    the provider's calls counted in a file of the test's own."""
    monkeypatch.setenv("EAGER_SINK", str(tmp_path / "provider.log"))
    monkeypatch.setitem(connections.settings[alias], "ATOMIC_REQUESTS", True)
    app = eager_site.app
    app.conf.update(deadlines_database=alias, task_eager_propagates=False)
    with override_settings(ROOT_URLCONF="tests.support.eager_site"):
        yield {"alias": alias, "client": Client()}
    app.conf.update(deadlines_database="default", task_eager_propagates=False)
    for store in api._stores.values():
        store.close()
    # the heartbeat lets its connections go once it has no lease to renew
    wait_for(lambda: not heartbeat()._used, timeout=10)


def run_of(alias: str, task_id: str) -> Run:
    return Run.objects.using(alias).get(task_id=task_id)


def effect_of(alias: str, key: str) -> Effect:
    return Effect.objects.using(alias).get(key=key)


def new_id(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def explain(alias: str, task_id: str) -> str:
    out = StringIO()
    call_command("deadlines", "--database", alias, "explain", task_id, stdout=out)
    return out.getvalue()


def test_a_view_that_delays_an_eager_task_gets_its_result_and_the_run_is_recorded(
    site: dict[str, Any],
) -> None:
    alias, order = site["alias"], new_id("o")
    response = site["client"].get(f"/order/{order}")
    assert response.status_code == 200, response.content
    answer = response.json()
    assert (answer["state"], answer["receipt"]) == ("SUCCESS", f"charge-receipt-{order}")
    assert provider_calls() == [f"charge {order} 12"]
    run = run_of(alias, answer["task_id"])
    assert (run.status, run.attempt, run.lease_token, run.task_name) == (
        "SUCCEEDED",
        1,
        1,
        "eager.charge",
    )
    # the task's budget, stamped by delay() before the row was written (SQLite keeps
    # created_at to the millisecond, cut: it may read up to one earlier than it was)
    assert run.deadline is not None
    assert run.created_at < run.deadline <= run.created_at + timedelta(seconds=60, milliseconds=1)
    effect = effect_of(alias, f"order-{order}:charge")
    assert (effect.state, effect.dispatches, effect.result) == (
        "SUCCEEDED",
        1,
        f"charge-receipt-{order}",
    )
    assert User.objects.db_manager(alias).filter(username__startswith=f"{order}-").exists()
    text = explain(alias, answer["task_id"])
    assert "status             SUCCEEDED" in text
    assert f"order-{order}:charge" in text
    # the eager run's own connection was closed when it ended
    eager = api._eager_stores.get(alias)
    local = eager._threads.local if eager is not None else None
    assert local is None or local.connection is None


def test_an_eager_runs_success_is_left_out_of_the_reconcilers_look_for_callers_waiting(
    site: dict[str, Any],
) -> None:
    """Its caller was told in its own process; Celery stores no result of it, which a
    worker's reconciler would otherwise read as a caller left waiting."""
    from celery_deadlines.ledger.sql.connection import Store

    alias, order = site["alias"], new_id("o")
    answer = site["client"].get(f"/order/{order}").json()
    run = run_of(alias, answer["task_id"])
    assert (run.status, run.op_detail) == ("SUCCEEDED", "eager run")
    assert run.result is not None  # kept: a second call with its id is told it
    store = Store(alias)
    try:
        now = store.database_now()
        looked = store.sweeps.ended_maybe_untold((now - timedelta(minutes=10), 0), now)
    finally:
        store.close()
    assert answer["task_id"] not in [ended.task_id for _, ended in looked]


def test_a_second_call_with_the_same_task_id_replays_the_run_and_performs_nothing(
    site: dict[str, Any],
) -> None:
    alias, order, task_id = site["alias"], new_id("o"), new_id("reload")
    first = site["client"].get(f"/order/{order}?task_id={task_id}")
    again = site["client"].get(f"/order/{order}?task_id={task_id}")
    assert (first.status_code, again.status_code) == (200, 200), again.content
    assert again.json() == first.json()
    assert provider_calls() == [f"charge {order} 12"]
    run = run_of(alias, task_id)
    assert (run.status, run.attempt) == ("SUCCEEDED", 1)
    claims = [(e.outcome, e.detail) for e in run.events.filter(kind="claim").order_by("id")]
    assert [outcome for outcome, _ in claims] == ["applied", "rejected"]
    assert claims[1][1].startswith("terminal")


def test_another_process_calling_the_same_task_id_is_told_the_run_and_performs_nothing(
    site: dict[str, Any],
) -> None:
    alias, order, task_id = site["alias"], new_id("o"), new_id("second")
    first = site["client"].get(f"/order/{order}?task_id={task_id}")
    assert first.status_code == 200, first.content
    # a second process with the same settings: the developer's `manage.py shell -c`
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.eager_settings",
        "EAGER_DATABASE": alias,
        "EAGER_DATABASE_NAME": str(connections[alias].settings_dict["NAME"]),
    }
    code = (
        "import json; from tests.support.eager_site import charge; "
        f"result = charge.apply_async(({order!r}, 12), task_id={task_id!r}); "
        "print(json.dumps({'state': result.state, 'result': result.get(), 'id': result.id}))"
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    told = json.loads(done.stdout.strip().splitlines()[-1])
    assert told == {"state": "SUCCESS", "result": f"charge-receipt-{order}", "id": task_id}
    assert provider_calls() == [f"charge {order} 12"]
    run = run_of(alias, task_id)
    assert (run.status, run.attempt) == ("SUCCEEDED", 1)
    assert run.events.filter(kind="claim", outcome="rejected").count() == 1


def test_a_view_that_fails_after_an_eager_charge_keeps_it_on_record_on_postgresql_only(
    site: dict[str, Any],
) -> None:
    alias, order, task_id = site["alias"], new_id("o"), new_id("failed-view")
    client = Client(raise_request_exception=False)
    failed = client.get(f"/order/{order}?task_id={task_id}&fail=1")
    assert failed.status_code == 500
    assert not User.objects.db_manager(alias).filter(username__startswith=f"{order}-").exists()
    again = client.get(f"/order/{order}?task_id={task_id}")
    assert again.status_code == 200, again.content
    assert again.json()["receipt"] == f"charge-receipt-{order}"
    if alias == "postgres":
        # the run's statements were committed on the ledger's own connection: the charge
        # the first request made is on record, and the reload is told it
        assert provider_calls() == [f"charge {order} 12"]
        assert run_of(alias, task_id).events.filter(kind="claim").count() == 2
    else:
        # SQLite: one writer at a time, the run's statements joined the request's
        # transaction, and went with it (docs/howto/eager.md says so)
        assert provider_calls() == [f"charge {order} 12"] * 2
        assert run_of(alias, task_id).events.filter(kind="claim").count() == 1
    assert run_of(alias, task_id).status == "SUCCEEDED"
    assert effect_of(alias, f"order-{order}:charge").dispatches == 1


def test_an_eager_retry_runs_inline_under_the_same_run_and_charges_once(
    site: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    alias, order = site["alias"], new_id("o")
    monkeypatch.setenv("EAGER_UNREACHABLE", order)
    response = site["client"].get(f"/order/{order}")
    assert response.status_code == 200, response.content
    assert response.json()["receipt"] == f"charge-receipt-{order}"
    assert provider_calls() == [f"refused charge {order}", f"charge {order} 12"]
    run = run_of(alias, response.json()["task_id"])
    assert (run.status, run.retries, run.attempt) == ("SUCCEEDED", 1, 2)
    moves = run.events.filter(outcome="applied", kind__in=["enqueue", "claim", "retry"])
    assert [e.kind for e in moves.order_by("id")] == ["enqueue", "claim", "retry", "claim"]
    effect = effect_of(alias, f"order-{order}:charge")
    assert (effect.state, effect.dispatches) == ("SUCCEEDED", 2)


def test_with_eager_propagates_a_retry_is_raised_to_the_caller_and_its_run_ends_failed(
    site: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Celery raises an eager retry to the caller when task_eager_propagates is set
    # (cookiecutter-django's local settings) and runs none: the run must not wait
    # RETRYING for a retry that never comes
    alias, order, task_id = site["alias"], new_id("o"), new_id("raised-retry")
    eager_site.app.conf.task_eager_propagates = True
    monkeypatch.setenv("EAGER_UNREACHABLE", order)
    with pytest.raises(Retry):
        eager_site.charge.apply_async((order, 12), task_id=task_id)
    assert provider_calls() == [f"refused charge {order}"]
    run = run_of(alias, task_id)
    assert (run.status, run.reason, run.retries, run.attempt) == ("FAILED", "error", 0, 1)
    assert "Retry" in run.detail
    assert "ProviderUnreachable" in (run.traceback or "")
    assert effect_of(alias, f"order-{order}:charge").state == "NOT_DISPATCHED"


@pytest.mark.parametrize("propagates", [False, True], ids=["stored", "propagated"])
def test_a_failing_eager_body_is_told_as_celery_tells_it_and_its_run_ends_failed(
    site: dict[str, Any], propagates: bool
) -> None:
    alias, task_id = site["alias"], new_id("broken")
    eager_site.app.conf.task_eager_propagates = propagates
    if propagates:
        with pytest.raises(ValueError, match="no price for o-1"):
            eager_site.broken.apply_async(("o-1",), task_id=task_id)
    else:
        result = eager_site.broken.apply_async(("o-1",), task_id=task_id)
        assert result.state == "FAILURE"
        with pytest.raises(ValueError, match="no price for o-1"):
            result.get()
    run = run_of(alias, task_id)
    assert (run.status, run.reason, run.attempt) == ("FAILED", "error", 1)
    assert "ValueError: no price for o-1" in (run.traceback or "")


@pytest.mark.parametrize("propagates", [False, True], ids=["stored", "propagated"])
def test_an_eager_run_past_its_deadline_is_refused_with_deadline_refused_and_expires(
    site: dict[str, Any], propagates: bool
) -> None:
    alias, order, task_id = site["alias"], new_id("o"), new_id("late")
    eager_site.app.conf.task_eager_propagates = propagates
    late = {DEADLINE_HEADER: encode(get_clock().now() - timedelta(seconds=1))}
    if propagates:
        with pytest.raises(DeadlineRefused) as raised:
            eager_site.charge.apply((order, 12), task_id=task_id, headers=late)
        refusal = raised.value
    else:
        result = eager_site.charge.apply((order, 12), task_id=task_id, headers=late)
        assert result.state == "FAILURE"
        refusal = result.result
        with pytest.raises(DeadlineRefused):
            result.get()
    assert isinstance(refusal, DeadlineRefused)
    assert (refusal.gate, refusal.reason) == ("attempt", "deadline_passed")
    assert provider_calls() == []
    run = run_of(alias, task_id)
    assert (run.status, run.reason, run.attempt) == ("EXPIRED", "deadline_passed", 0)


@pytest.mark.parametrize("propagates", [False, True], ids=["stored", "propagated"])
def test_an_eager_body_that_runs_past_its_deadline_ends_its_run_expired_and_is_refused(
    site: dict[str, Any], propagates: bool
) -> None:
    # no worker supervises an eager body and no reconciler will visit its run: the
    # caller's own process ends it, and the caller is told as a worker's caller is
    alias, order, task_id = site["alias"], new_id("o"), new_id("overdue")
    eager_site.app.conf.task_eager_propagates = propagates
    if propagates:
        with pytest.raises(DeadlineRefused) as raised:
            eager_site.overdue.apply_async((order,), task_id=task_id)
        refusal = raised.value
    else:
        result = eager_site.overdue.apply_async((order,), task_id=task_id)
        assert result.state == "FAILURE"
        refusal = result.result
    assert isinstance(refusal, DeadlineRefused)
    assert (refusal.gate, refusal.reason) == ("attempt", "deadline_passed")
    run = run_of(alias, task_id)
    assert (run.status, run.reason, run.attempt) == ("EXPIRED", "deadline_passed", 1)
    assert run.deadline is not None
    assert run.updated_at >= run.deadline
    assert "the eager body ran past its deadline" in explain(alias, task_id)


def test_children_published_from_an_eager_body_are_runs_of_their_own_under_its_deadline(
    site: dict[str, Any],
) -> None:
    alias, order = site["alias"], new_id("o")
    response = site["client"].get(f"/checkout/{order}")
    assert response.status_code == 200, response.content
    answer = response.json()
    assert (answer["receipt"], answer["mailed"]) == (
        f"charge-receipt-{order}",
        f"mail-receipt-{order}",
    )
    assert provider_calls() == [f"charge {order} 20", f"mail {order} 0"]
    parent = run_of(alias, answer["task_id"])
    for child_id in (answer["charge"], answer["mail"]):
        child = run_of(alias, child_id)
        assert (child.status, child.parent_id, child.root_id) == (
            "SUCCEEDED",
            parent.task_id,
            parent.task_id,
        )
        assert child.deadline == parent.deadline  # inherited, never lengthened
    assert parent.status == "SUCCEEDED"


def test_apply_called_directly_is_a_recorded_run_too(site: dict[str, Any]) -> None:
    alias, order = site["alias"], new_id("o")
    result = eager_site.charge.apply((order, 12))
    assert result.get() == f"charge-receipt-{order}"
    run = run_of(alias, result.id)
    # apply() publishes nothing: the row is rebuilt from the request, with the deadline
    # its headers carry (none given here)
    assert (run.status, run.attempt, run.deadline) == ("SUCCEEDED", 1, None)
    assert effect_of(alias, f"order-{order}:charge").state == "SUCCEEDED"


def test_an_eager_task_with_no_budget_runs_claimed_with_no_deadline(site: dict[str, Any]) -> None:
    alias, order = site["alias"], new_id("o")
    result = eager_site.unbudgeted.delay(order)
    assert result.get() == {"remaining": float("inf"), "token": 1}
    run = run_of(alias, result.id)
    assert (run.status, run.deadline) == ("SUCCEEDED", None)
    assert provider_calls() == [f"charge {order} 0"]


def test_the_same_task_id_with_other_arguments_is_a_conflict_and_runs_nothing(
    site: dict[str, Any],
) -> None:
    from celery_deadlines import RunConflict

    alias, order, task_id = site["alias"], new_id("o"), new_id("conflict")
    eager_site.charge.apply_async((order, 12), task_id=task_id)
    with pytest.raises(RunConflict, match="now with args"):
        eager_site.charge.apply_async((order, 13), task_id=task_id)
    assert provider_calls() == [f"charge {order} 12"]
    assert run_of(alias, task_id).events.filter(kind="claim").count() == 1


def test_an_eager_body_that_outlives_a_renewal_keeps_its_lease(site: dict[str, Any]) -> None:
    alias, order = site["alias"], new_id("o")
    response = site["client"].get(f"/slow/{order}")
    assert response.status_code == 200, response.content
    assert response.json()["receipt"] == f"charge-receipt-{order}"
    run = run_of(alias, response.json()["task_id"])
    assert run.status == "SUCCEEDED"
    renewals = run.events.filter(kind="renew").values_list("outcome", flat=True)
    if alias == "postgres":
        # the heartbeat renewed it on its own connection, as a worker's
        assert set(renewals) == {"applied"}
    else:
        # SQLite: the row is the request's until it commits, after the run: no other
        # connection may renew it, nor take it over; the lease the claim gave is kept
        assert list(renewals) == []


def test_an_eager_body_that_outlives_its_lease_keeps_it_on_postgresql_only(
    site: dict[str, Any],
) -> None:
    alias, order = site["alias"], new_id("o")
    response = site["client"].get(f"/slow/{order}?overlong=1")
    assert response.status_code == 200, response.content
    answer = response.json()
    run = run_of(alias, answer["task_id"])
    if alias == "postgres":
        assert (answer["state"], answer["receipt"]) == ("SUCCESS", f"charge-receipt-{order}")
        assert run.status == "SUCCEEDED"
        assert provider_calls() == [f"charge {order} 0"]
    else:
        # SQLite inside the request's transaction: the lease is not renewed, and the
        # guard refuses a body past it (docs/howto/eager.md): nothing charged, nothing stored
        assert (answer["state"], answer["receipt"]) == ("IGNORED", None)
        assert run.status == "RUNNING"  # its lease lapsed; committed with the request
        rejected = set(run.events.filter(outcome="rejected").values_list("kind", flat=True))
        assert rejected == {"dispatch", "failed"}  # the guard, then the run's end
        assert provider_calls() == []
