"""What Celery's own tools are told of a run the ledger ends, against the ledger on SQLite
and PostgreSQL: the result stored with the request a worker would have had (the
extended fields django-celery-results and Flower show), never over a final state the
caller was already told; and a run Celery itself ended, recorded as what it is.

The in-process integration of these with a real worker, Flower and django-celery-results
is tests/integration/ledger/test_celery_report_flower_and_results.py; here each rule is held alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery, states
from celery.backends import cache as cache_backend
from celery.exceptions import TaskRevokedError

from celery_deadlines import DeadlineRefused, DeadlineTask, NotFound, operator_needed
from celery_deadlines.ledger import api, celery_report, outbox
from celery_deadlines.ledger.reconcile import reconcile_once
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.ledger.sql.rows import Lease, NewRun
from celery_deadlines.models import Run, Status
from celery_deadlines.rules.outcomes import ended_by_celery
from tests.support.memory_queue import drain

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgres"])


@pytest.fixture
def store(alias: str) -> Store:
    """The ledger on ``alias`` (each test on both; the workers' stores closed after)."""
    return Store(alias)


@pytest.fixture
def app() -> Iterator[Celery]:
    # Celery's in-memory cache backend is one dict for every app of the process: a
    # result another test stored under the same id would read as "already told"
    cache_backend._DUMMY_CLIENT_CACHE.clear()  # type: ignore[attr-defined]
    app = Celery("celery-report-test", broker="memory://", backend="cache+memory://")
    app.conf.update(result_extended=True, task_default_queue="q")
    drain(app, "q")
    yield app
    drain(app, "q")
    app.close()


def record(store: Store, task_id: str, *, past_deadline: bool = True, **options: Any) -> None:
    """A run published to queue ``orders`` with ``(7,)`` and ``{"fast": True}``."""
    body, content_type, encoding = outbox.encode_message(
        "json", [7], {"fast": True}, {"queue": "orders", **options}
    )
    store.outbox.enqueue(
        NewRun(
            task_id=task_id,
            task_name="shop.ship",
            deadline=store.database_now() + timedelta(seconds=600),
            root_id="root-1",
            queue="orders",
            message_body=body,
            content_type=content_type,
            content_encoding=encoding,
        )
    )
    if past_deadline:
        Run.objects.using(store.using).filter(task_id=task_id).update(
            deadline=store.database_now() - timedelta(seconds=1), op="age"
        )


def meta(app: Celery, task_id: str) -> dict[str, Any]:
    found: dict[str, Any] = app.backend.get_task_meta(task_id, cache=False)
    return found


def test_a_run_the_sweeper_expires_is_stored_with_the_fields_a_workers_failure_has(
    store: Store, app: Celery
) -> None:
    record(store, "swept", headers={"periodic_task_name": "nightly"})
    assert reconcile_once(app, store).expired == ["swept"]
    stored = meta(app, "swept")
    assert stored["status"] == states.FAILURE
    assert (stored["name"], stored["args"], stored["kwargs"]) == ("shop.ship", [7], {"fast": True})
    assert (stored["queue"], stored["retries"]) == ("orders", 0)
    with pytest.raises(DeadlineRefused, match="deadline_passed"):
        app.AsyncResult("swept").get(timeout=1)


def test_the_request_of_a_recorded_run_carries_what_django_celery_results_reads(
    store: Store, app: Celery
) -> None:
    record(store, "told", past_deadline=False, headers={"periodic_task_name": "nightly"})
    request: Any = celery_report.request_for(app, store, "told")
    assert (request.task, request.root_id, request.periodic_task_name) == (
        "shop.ship",
        "root-1",
        "nightly",
    )
    assert (request.argsrepr, request.kwargsrepr) == ("(7,)", "{'fast': True}")
    assert request.delivery_info == {"routing_key": "orders"}


def test_a_run_with_no_readable_message_is_told_with_its_name_and_id_alone(
    store: Store, app: Celery
) -> None:
    record(store, "opaque", past_deadline=False)
    Run.objects.using(store.using).filter(task_id="opaque").update(
        content_type="application/x-python-serialize", op="age"
    )  # pickle: a stored row is never decoded with a serializer the app does not accept
    request: Any = celery_report.request_for(app, store, "opaque")
    assert (request.id, request.task, request.args) == ("opaque", "shop.ship", None)


def test_a_final_state_the_caller_was_told_is_never_replaced_by_the_ledgers_end(
    store: Store, app: Celery
) -> None:
    record(store, "revoked")
    app.backend.mark_as_revoked("revoked", "expired")
    assert reconcile_once(app, store).expired == ["revoked"]  # the ledger ends it ...
    assert meta(app, "revoked")["status"] == states.REVOKED  # ... and tells nobody over it
    with pytest.raises(TaskRevokedError):
        app.AsyncResult("revoked").get(timeout=1)


@pytest.mark.parametrize(
    ("expired", "terminated", "status", "reason"),
    [
        (True, False, Status.EXPIRED, "expired_by_celery"),
        (False, False, Status.FAILED, "revoked_by_celery"),
        (False, True, Status.FAILED, "revoked_by_celery"),
    ],
)
def test_a_run_celery_ended_is_recorded_as_what_celery_did_and_fences_its_holder(
    store: Store, expired: bool, terminated: bool, status: Status, reason: str
) -> None:
    record(store, "celery", past_deadline=False)
    before = Run.objects.using(store.using).get(task_id="celery").lease_token
    end = ended_by_celery(expired=expired, terminated=terminated, signum=15)
    assert store.sweeps.end_by_celery("celery", *end)
    run = Run.objects.using(store.using).get(task_id="celery")
    assert (run.status, run.reason, run.op) == (status, reason, "celery")
    assert run.lease_token == before + 1
    assert not store.sweeps.end_by_celery("celery", *end)  # ended once; never again


def test_a_run_celery_ended_after_the_ledger_ended_it_keeps_the_ledgers_end(
    store: Store, app: Celery
) -> None:
    record(store, "ended")
    reconcile_once(app, store)
    assert not store.sweeps.end_by_celery("ended", *ended_by_celery(expired=True, terminated=False))
    assert Run.objects.using(store.using).get(task_id="ended").reason == "deadline_passed"


# -- a run that needs a person -------------------------------------------------------


@pytest.fixture
def pages() -> Iterator[list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    def record_page(sender: Any = None, **fields: Any) -> None:
        sent.append(fields)

    operator_needed.connect(record_page, weak=False, dispatch_uid="test_celery_report.pages")
    yield sent
    operator_needed.disconnect(dispatch_uid="test_celery_report.pages")


def dispatched_and_lapsed(store: Store, task_id: str, key: str) -> None:
    """The run's attempt dispatched ``key`` (effect ``pay``), then its worker vanished."""
    record(store, task_id, past_deadline=False)
    lease = store.runs.claim(
        task_id,
        0,
        task_name="shop.ship",
        owner="w:1",
        ttl=timedelta(seconds=30),
        reserve=timedelta(0),
        max_lost_leases=5,
    )
    assert isinstance(lease, Lease)
    store.effects.record_intent(lease, key, "pay", "execution", "f")
    assert store.effects.dispatch(lease, key) == 1
    Run.objects.using(store.using).filter(task_id=task_id).update(
        lease_expires_at=store.database_now() - timedelta(seconds=2), op="age"
    )


def ship() -> None:
    """The task of every recorded run here (its body never runs)."""


def ship_task(app: Celery, *, reconciled: bool) -> None:
    task = app.task(base=DeadlineTask, name="shop.ship", shared=False)(ship)
    if reconciled:
        task.reconciler("pay")(lambda pending: NotFound(evidence="provider"))


@pytest.mark.parametrize("reconciled", [False, True], ids=["no-reconciler", "reconciler"])
def test_the_reconciler_pages_a_person_once_only_for_an_effect_its_task_cannot_settle(
    store: Store, app: Celery, pages: list[dict[str, Any]], reconciled: bool
) -> None:
    ship_task(app, reconciled=reconciled)
    dispatched_and_lapsed(store, "lapsed", "lapsed:pay")
    assert reconcile_once(app, store).unknown == ["lapsed"]
    reconcile_once(app, store)  # a later pass: never again
    expected = [] if reconciled else [("lapsed", "shop.ship", ["lapsed:pay"])]
    assert [(p["task_id"], p["task_name"], p["keys"]) for p in pages] == expected


def test_a_hard_time_limit_that_leaves_an_effect_unknown_pages_through_the_ledger_api(
    store: Store, app: Celery, pages: list[dict[str, Any]]
) -> None:
    ship_task(app, reconciled=False)
    app.conf.deadlines_database = store.using
    dispatched_and_lapsed(store, "limited", "limited:pay")
    api.tell_caller_unknown(app, "limited", "hard time limit (5 s) exceeded", "shop.ship")
    assert [(p["task_id"], p["keys"]) for p in pages] == [("limited", ["limited:pay"])]
    assert str(app.AsyncResult("limited").state) == "UNKNOWN"


def test_a_caller_left_waiting_by_a_reconciler_that_died_after_its_expiry_is_told_later(
    store: Store, app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nemesis soak, seed 452933: a worker was SIGKILLed 37 ms after its reconciler
    committed an expiry, before it told the caller, and the broker lost the message."""
    from celery_deadlines.ledger import reconcile

    monkeypatch.setattr(reconcile, "_looked_up_to", None)
    record(store, "died")
    with monkeypatch.context() as dying:
        dying.setattr(reconcile, "store_refusal", lambda *args, **kwargs: None)
        assert reconcile_once(app, store).expired == ["died"]  # committed, never told
    assert app.AsyncResult("died").state == states.PENDING
    reconcile_once(app, store)  # within the grace: left to the process that ended it
    assert app.AsyncResult("died").state == states.PENDING
    Run.objects.using(store.using).filter(task_id="died").update(
        updated_at=store.database_now() - reconcile.RETELL_GRACE * 2
    )  # (the ORM's update leaves op as the expiry wrote it)
    reconcile_once(app, store)  # any worker's next pass
    with pytest.raises(DeadlineRefused, match="deadline_passed"):
        app.AsyncResult("died").get(timeout=1)
    assert meta(app, "died")["name"] == "shop.ship"


def test_a_run_the_ledger_ended_whose_caller_was_told_is_not_told_again(
    store: Store, app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_deadlines.ledger import reconcile

    monkeypatch.setattr(reconcile, "_looked_up_to", None)
    record(store, "told-once")
    reconcile_once(app, store)
    first = meta(app, "told-once")
    Run.objects.using(store.using).filter(task_id="told-once").update(
        updated_at=store.database_now() - reconcile.RETELL_GRACE * 2
    )
    stored: list[str] = []
    monkeypatch.setattr(
        app.backend, "mark_as_failure", lambda task_id, *a, **k: stored.append(task_id)
    )
    reconcile_once(app, store)
    assert stored == []  # looked at, found told: nothing stored over it
    assert repr(meta(app, "told-once")["result"]) == repr(first["result"])


def succeeded(
    store: Store, task_id: str, value: Any, *, ago: timedelta, op_detail: str = ""
) -> None:
    """A run recorded (``record``) and ended SUCCEEDED ``ago``, as a worker's completion
    ends it (an eager run's: ``op_detail`` "eager run"), keeping ``value`` (JSON) unless
    it is ``None``."""
    record(store, task_id, past_deadline=False)
    kept = (
        (None, None, None)
        if value is None
        else (json.dumps(value).encode(), "application/json", "utf-8")
    )
    Run.objects.using(store.using).filter(task_id=task_id).update(
        status=Status.SUCCEEDED,
        op="succeeded",
        op_detail=op_detail,
        result=kept[0],
        result_content_type=kept[1],
        result_encoding=kept[2],
        updated_at=store.database_now() - ago,
    )


def test_a_caller_left_waiting_by_a_worker_killed_after_its_run_succeeded_is_told_its_value(
    store: Store, app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chaos soak, seed 778971: the whole worker was SIGKILLed between the completion's
    commit and Celery's store of the result; its message was acknowledged on receipt, so
    no delivery comes back to tell the caller."""
    from celery_deadlines.ledger import reconcile

    monkeypatch.setattr(reconcile, "_looked_up_to", None)
    app.backend.mark_as_retry("killed", RuntimeError("first try"))
    succeeded(store, "killed", {"shipped": 7}, ago=timedelta(0))
    reconcile_once(app, store)  # within the grace: left to the worker that ended it
    assert app.AsyncResult("killed").state == states.RETRY
    succeeded(store, "killed", {"shipped": 7}, ago=reconcile.RETELL_GRACE * 2)
    reconcile_once(app, store)
    assert app.AsyncResult("killed").get(timeout=1) == {"shipped": 7}
    assert (meta(app, "killed")["name"], meta(app, "killed")["args"]) == ("shop.ship", [7])


def test_a_success_whose_caller_was_told_that_kept_no_value_or_ran_eagerly_is_not_told_again(
    store: Store, app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_deadlines.ledger import reconcile

    monkeypatch.setattr(reconcile, "_looked_up_to", None)
    app.backend.mark_as_done("told", {"by": "its worker"})
    succeeded(store, "told", {"by": "the ledger"}, ago=reconcile.RETELL_GRACE * 2)
    succeeded(store, "nothing-kept", None, ago=reconcile.RETELL_GRACE * 2)
    succeeded(store, "eager", 1, ago=reconcile.RETELL_GRACE * 2, op_detail="eager run")
    reconcile_once(app, store)
    assert app.AsyncResult("told").get(timeout=1) == {"by": "its worker"}
    assert app.AsyncResult("nothing-kept").state == states.PENDING
    assert app.AsyncResult("eager").state == states.PENDING  # told in its own process


def test_the_end_of_a_task_that_stores_no_errors_is_told_once_not_once_per_worker(
    store: Store, app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``ignore_result`` task's result never says its caller was told: a later pass
    (every worker's) would call its errbacks again."""
    from celery_deadlines.ledger import reconcile

    monkeypatch.setattr(reconcile, "_looked_up_to", None)
    app.task(base=DeadlineTask, name="shop.ship", shared=False, ignore_result=True)(ship)
    told: list[str] = []
    monkeypatch.setattr(
        app.backend, "mark_as_failure", lambda task_id, *a, **k: told.append(task_id)
    )
    record(store, "quiet")
    assert reconcile_once(app, store).expired == ["quiet"]
    assert told == ["quiet"]  # the sweeper's own telling: errbacks called once
    Run.objects.using(store.using).filter(task_id="quiet").update(
        updated_at=store.database_now() - reconcile.RETELL_GRACE * 2
    )
    monkeypatch.setattr(reconcile, "_looked_up_to", None)  # another worker's pass
    reconcile_once(app, store)
    assert told == ["quiet"]


def test_a_success_older_than_its_results_last_is_not_told_again(
    store: Store, app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker started later looks back over the window: a result the backend let
    expire (``result_expires``) reads as never stored, and is not stored again."""
    from celery_deadlines.ledger import reconcile

    monkeypatch.setattr(reconcile, "_looked_up_to", None)
    app.conf.result_expires = 30  # a pass looks back 28 s
    succeeded(store, "expired-result", "old", ago=timedelta(seconds=40))
    succeeded(store, "left-waiting", "recent", ago=timedelta(seconds=10))
    reconcile_once(app, store)
    assert app.AsyncResult("expired-result").state == states.PENDING
    assert app.AsyncResult("left-waiting").get(timeout=1) == "recent"


def test_which_callers_wait_is_read_at_once_where_the_backend_can_and_one_by_one_where_not(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    app.backend.mark_as_done("told", 1)
    app.backend.mark_as_retry("retrying", RuntimeError("again"))
    ids = ["told", "retrying", "never-stored"]
    asked: list[list[Any]] = []
    mget = app.backend.mget  # type: ignore[attr-defined]  # a key-value store's

    def counted(keys: list[Any]) -> Any:
        asked.append(keys)
        return mget(keys)

    monkeypatch.setattr(app.backend, "mget", counted)
    assert celery_report.untold(app, ids) == ["retrying", "never-stored"]
    assert len(asked) == 1  # one round trip for the page

    def unsupported(keys: list[Any]) -> Any:
        raise NotImplementedError("Does not support get_many")

    monkeypatch.setattr(app.backend, "mget", unsupported)
    assert celery_report.untold(app, ids) == ["retrying", "never-stored"]


def test_which_callers_wait_is_read_in_one_query_from_django_celery_results() -> None:
    """django-celery-results keeps results as rows (``django-db``): a page's states are
    read in one query, not one each."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    app = Celery("dcr", broker="memory://", backend="django-db")
    try:
        app.backend.mark_as_done("told", 1)
        app.backend.store_result("started", None, states.STARTED)
        ids = ["told", "started", "never-stored"]
        with CaptureQueriesContext(connections["default"]) as queries:
            assert celery_report.untold(app, ids) == ["started", "never-stored"]
        assert len(queries) == 1
    finally:
        app.close()


def test_runs_ended_at_one_instant_beyond_a_page_are_each_told_once(
    store: Store, app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The expiry sweep ends a batch in one statement, at one ``updated_at``: the pass
    pages by (``updated_at``, id), so a page boundary inside the batch loses none."""
    from celery_deadlines.ledger import reconcile

    monkeypatch.setattr(reconcile, "_looked_up_to", None)
    monkeypatch.setattr(reconcile, "RETELL_PAGE", 2)
    for n in range(5):
        succeeded(store, f"batch-{n}", n, ago=timedelta(0))
    Run.objects.using(store.using).update(
        updated_at=store.database_now() - reconcile.RETELL_GRACE * 2
    )
    stored: list[str] = []
    store_done = app.backend.mark_as_done

    def counted(task_id: str, *args: Any, **kwargs: Any) -> Any:
        stored.append(task_id)
        return store_done(task_id, *args, **kwargs)

    monkeypatch.setattr(app.backend, "mark_as_done", counted)
    reconcile_once(app, store)
    app.backend.forget("batch-0")  # a later pass looks at none of them again
    reconcile_once(app, store)
    assert sorted(stored) == [f"batch-{n}" for n in range(5)]
    assert [app.AsyncResult(f"batch-{n}").get(timeout=1) for n in range(1, 5)] == [1, 2, 3, 4]


# -- a run whose deadline was Celery's own ``expires`` ------------------------------------

#: the headers a DeadlineTask's publish writes when the caller's ``expires`` is earlier
#: than its budget: that ``expires`` is the deadline
EXPIRES_GOVERNED = {"x_deadline": 1.0, "x_deadline_source": "expires"}


@pytest.fixture
def task_events(app: Celery, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """Every task event the ledger sends of a run, as ``(kind, fields)``."""
    sent: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(
        celery_report,
        "send_event",
        lambda app, kind, task_id, **fields: sent.append((kind, fields)),
    )
    return sent


def test_a_run_the_sweeper_expires_whose_deadline_was_its_expires_is_told_as_celery_tells_it(
    store: Store, app: Celery, task_events: list[tuple[str, dict[str, Any]]]
) -> None:
    record(store, "expires-swept", headers=EXPIRES_GOVERNED)
    assert reconcile_once(app, store).expired == ["expires-swept"]
    stored = meta(app, "expires-swept")
    assert stored["status"] == states.REVOKED
    assert (stored["name"], stored["args"], stored["queue"]) == ("shop.ship", [7], "orders")
    with pytest.raises(TaskRevokedError, match="expired"):
        app.AsyncResult("expires-swept").get(timeout=1)
    assert task_events == [("task-revoked", {"terminated": False, "signum": None, "expired": True})]
    # the ledger keeps its own reason
    run = Run.objects.using(store.using).get(task_id="expires-swept")
    assert (run.status, run.reason) == (Status.EXPIRED, "deadline_passed")


@pytest.mark.parametrize("source", ["default", "call", "parent", "Expires", None])
def test_a_run_the_sweeper_expires_whose_deadline_was_not_its_expires_is_told_the_refusal(
    store: Store, app: Celery, task_events: list[tuple[str, dict[str, Any]]], source: str | None
) -> None:
    headers: dict[str, Any] = {"x_deadline": 1.0}
    if source is not None:
        headers["x_deadline_source"] = source
    record(store, "budget-swept", headers=headers)
    assert reconcile_once(app, store).expired == ["budget-swept"]
    assert meta(app, "budget-swept")["status"] == states.FAILURE
    with pytest.raises(DeadlineRefused, match="deadline_passed"):
        app.AsyncResult("budget-swept").get(timeout=1)
    assert [kind for kind, _ in task_events] == ["task-failed"]


def test_an_operators_expiry_of_a_run_whose_deadline_was_its_expires_is_told_as_the_operators(
    store: Store, app: Celery
) -> None:
    # only a refusal for the deadline itself is Celery's expiry; a person's is not
    from celery_deadlines.ledger import operations

    record(store, "expires-operator", past_deadline=False, headers=EXPIRES_GOVERNED)
    run = Run.objects.using(store.using).get(task_id="expires-operator")
    assert operations.expire_run(app, store, run.pk, operator="alice")
    with pytest.raises(DeadlineRefused, match="expired_by_operator"):
        app.AsyncResult("expires-operator").get(timeout=1)
