"""The ledger's entry point for the Celery tier: plain values in, plain values out.

:class:`~celery_deadlines.task.DeadlineTask` and the worker's request call these once
:func:`celery_deadlines.ledger.enabled_for` said yes (lazily: the plain Celery tier never
imports Django). Nothing here knows the task class: the caller passes the run's id,
name, durations and message, and says whether a publish is a retry. Translating the
outcomes into Celery's ``Ignore``/``Retry`` stays with the caller.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, Final, NamedTuple

from django.db import connections

from .. import clock, conf
from ..conf import Settings, settings_for
from ..errors import LedgerUnreachable
from ..rules.limits import AttemptLimits, claim_detail
from ..rules.records import (
    ClaimRefused,
    EndedRun,
    Held,
    KeptResult,
    Lease,
    NewRun,
    Recorded,
    Refusal,
)
from ..rules.skew import ClockReading, Readiness, describe, gate
from ..rules.states import Status
from . import operations, outbox
from ._crashpoints import hit
from .attempt import Attempt, owner_name, owner_name_of
from .clockwatch import measure
from .outbox import check_repeat, encode_message, readable_by_workers
from .patience import CONNECTION_ERRORS, Patience
from .reconcile import running
from .results import keep as _keep
from .results import read as _read
from .sql.connection import Store
from .sql.rows import ExistingRun

__all__ = [
    "Attempt",
    "ClaimRefused",
    "EndedRun",
    "ExistingRun",
    "Held",
    "Lease",
    "NewRun",
    "Recorded",
    "check_repeat",
    "claim_run",
    "describe",
    "eager_run",
    "encode_message",
    "end_owned",
    "ended_run",
    "hand_to_retry",
    "keep_result",
    "lapse_owned",
    "measure",
    "publish_failed",
    "read_result",
    "readable_by_workers",
    "record_eager_run",
    "record_run",
    "refuse_publish",
    "refuse_run",
    "release_connections",
    "send_at_commit",
    "store_for",
    "tell_caller_unknown",
]

_stores: dict[tuple[str, bool], Store] = {}


def store_for(app: Any, *, dedicated: bool = False) -> Store:
    """The ledger store on the alias the app's settings name.

    ``dedicated``: the worker's store, on a connection of its own (see :class:`Store`);
    otherwise Django's connection, so writes join the caller's transaction.
    """
    key = (settings_for(app).get(conf.DATABASE), dedicated)
    try:
        return _stores[key]
    except KeyError:
        store = _stores[key] = Store(key[0], dedicated=dedicated)
        return store


def release_connections() -> None:
    """A job ended in this thread: each store's dedicated connection goes to the next
    thread that needs one (:meth:`~.sql.connection.Store.release`)."""
    for store in _stores.values():
        store.release()


def _attempts_store(app: Any) -> Store:
    """The store of the attempt running in this thread: the worker's own, or, inside an
    eager run (:func:`eager_run`), that run's (its refusal, and the ledger's answers to
    it, are read and written where its row is)."""
    store = store_for(app, dedicated=True)
    return _eager_store(store.using) or store


# -- eager runs (``apply()``: the caller runs the task inline) ----------------------------

#: The eager runs' own stores, by alias: a connection of their own per thread, which the
#: outermost eager run of a thread closes when it ends (a web process, a script, a test
#: keeps no connection of the library's between its eager runs).
_eager_stores: dict[str, Store] = {}


class _EagerRuns(threading.local):
    """The stores of the eager runs this thread is in, innermost last."""

    def __init__(self) -> None:
        self.stores: list[Store] = []


_eager = _EagerRuns()


def _eager_store(using: str) -> Store | None:
    """The store of the innermost eager run in this thread, when it is on ``using``."""
    stores = _eager.stores
    if stores and stores[-1].using == using:
        return stores[-1]
    return None


def store_of_an_eager_run(app: Any) -> Store:
    """Where an eager run's statements go, decided when it starts.

    An eager run is the caller's own code, run inline, often inside its transaction
    (``ATOMIC_REQUESTS``). On its own connection, committed at once as a worker's are,
    its row, claim, effects and end stand whatever becomes of that transaction: a
    performed effect is not forgotten when the request rolls back. SQLite lets one
    connection write at a time, and a transaction open on Django's connection holds the
    database (a second connection waits out the alias's ``timeout``, then fails: "database
    is locked"): there, inside a transaction, the run's statements join it on Django's
    connection, and are committed or rolled back with it."""
    using = settings_for(app).get(conf.DATABASE)
    connection = connections[using]
    if connection.vendor == "sqlite" and connection.in_atomic_block:
        return store_for(app)
    store = _eager_stores.get(using)
    if store is None:
        store = _eager_stores[using] = Store(using, dedicated=True)
    return store


@contextmanager
def eager_run(app: Any) -> Iterator[None]:
    """The ledger's statements of an eager run, in this thread, on
    :func:`store_of_an_eager_run`'s store (nested runs, a child or a retry, each on
    theirs); the outermost closes its connection when it ends."""
    store = store_of_an_eager_run(app)
    stores = _eager.stores
    stores.append(store)
    try:
        yield
    finally:
        stores.pop()
        if store.dedicated and store not in stores:
            store.close()


def record_eager_run(app: Any, run: NewRun) -> None:
    """Record an eager run, inside :func:`eager_run`, which the caller then sends:
    Celery's ``apply()``, which runs it here and now, whatever the caller's transaction
    (:func:`store_of_an_eager_run`). A run id the ledger already has is checked as a
    repeat (:func:`check_repeat`: another task or other arguments raise
    :class:`~celery_deadlines.errors.RunConflict`) and the same run is sent again: its
    claim decides (a run that ended tells this caller its outcome, one that another
    process runs is not run twice)."""
    store = _eager.stores[-1]
    if not store.outbox.enqueue(run):
        accept = readable_by_workers(app, run.task_name)
        check_repeat(store.outbox.existing(run.task_id), run, accept=accept)


class _Claiming(NamedTuple):
    """What every claim reads from an app's settings, kept while their stamp holds."""

    #: the configuration Celery loaded for the app when this was read
    conf: object
    settings: Settings
    stamp: object
    store: Store
    max_lost_leases: int
    clock_skew_budget: timedelta | None


#: The app's attribute that keeps its :class:`_Claiming`.
_CLAIMING: Final = "_celery_deadlines_claiming"


def _claiming(app: Any) -> _Claiming:
    """The :class:`_Claiming` of ``app``, kept on it (as its settings are, see
    :func:`~celery_deadlines.conf.settings_for`) while its configuration and its
    settings' stamp are the same; read again otherwise."""
    kept: _Claiming | None = getattr(app, _CLAIMING, None)
    if (
        kept is not None
        and kept.conf is getattr(app, "_conf", None)
        and kept.stamp == kept.settings.stamp()
    ):
        return kept
    settings = settings_for(app)
    fresh = _Claiming(
        getattr(app, "_conf", None),
        settings,
        settings.stamp(),
        store_for(app, dedicated=True),
        settings.get(conf.MAX_LOST_LEASES),
        settings.get(conf.CLOCK_SKEW_BUDGET),
    )
    setattr(app, _CLAIMING, fresh)
    return fresh


def record_run(app: Any, run: NewRun, *, publisher: Attempt | None = None) -> Recorded:
    """Record a new run, and say when the caller sends its message (see :mod:`.outbox`):
    now, at the caller's commit (:func:`send_at_commit`), or not at all, when the run
    already exists with the same task and arguments (another task or other arguments
    raise :class:`~celery_deadlines.errors.RunConflict`). A send now that raises is
    told to :func:`publish_failed`.

    ``publisher``: the attempt whose body publishes the run. Outside the caller's own
    transaction its row rides out a database cut as the body's other writes do
    (:meth:`~.attempt.Attempt.patiently`); a row whose commit's answer was lost is found
    again, and the sweeper publishes it (nothing is lost, nothing sent twice). Inside
    the caller's ``transaction.atomic()`` the library cannot try again: the error is
    the caller's (docs/howto/database-outage.md)."""
    accept = outbox.readable_by_workers(app, run.task_name)
    store = store_for(app)
    connection = connections[store.using]
    if publisher is None or connection.in_atomic_block:
        return outbox.record(store, run, accept=accept)

    def record() -> Recorded:
        # Django's connection is unusable after a lost one until it is closed: outside
        # a transaction, closing it is safe (the next statement connects again)
        connection.close_if_unusable_or_obsolete()
        return outbox.record(store, run, accept=accept)

    return publisher.patiently(f"the outbox row of {run.task_name}[{run.task_id}]", record)


def publish_failed(app: Any, task_id: str, error: BaseException) -> None:
    """The message of a run :func:`record_run` recorded to send now could not be sent
    (``error``): the run ends ``publish_failed``, and the caller is given ``error``."""
    outbox.publish_failed(store_for(app), task_id, error)


def send_at_commit(app: Any, send: Callable[[], None]) -> None:
    """Send a run :func:`record_run` recorded in the caller's transaction when that
    commits (``send`` runs then, or never, on a rollback)."""
    outbox.at_commit(store_for(app), send)


def hand_to_retry(
    attempt: Attempt, *, retries: int, available_at: datetime | None, message_body: bytes
) -> None:
    """The attempt running in this process hands its run to its retry message, which the
    caller sends next: a fenced write (raises :class:`StaleLease` if the attempt lost
    its lease: nothing is to be published)."""
    attempt.retry(retries, available_at, message_body, f"retries={retries}")
    hit("retry.reserved", attempt.lease.task_id)


def claim_run(
    app: Any,
    *,
    task_id: str,
    task_name: str,
    retries: int,
    hostname: str | None,
    ttl: timedelta,
    reserve: timedelta,
    unrecorded: Callable[[], NewRun],
    exclusive: bool = False,
    eager: bool = False,
    limits: AttemptLimits | None = None,
) -> Attempt | ClaimRefused | Held:
    """Claim the run of the message being executed (recording it first, from
    ``unrecorded()``, if it has no row: published by name, or before the app was
    installed). ``task_name`` is the message's task: the run of ``task_id`` is claimed
    only if it is a run of that task (else refused, ``task_mismatch``, and left as it is).

    ``exclusive``: the owner (this process) runs no other attempt until this one ends
    (a prefork pool process, a solo worker): a won claim need not wait for the disk
    (:meth:`~.sql.runs.Runs.claim`). ``eager``: an eager run's claim, made on its store
    (:func:`eager_run`). ``limits``: the time limits the attempt was given, which the
    claim's event records (``None``: not known).

    A database that cannot be reached is tried again for up to one lease (``ttl``),
    then :class:`~celery_deadlines.errors.LedgerUnreachable` is raised.

    The claim's round trip is also a clock reading (the database's clock between two
    local ones): with ``deadlines_clock_skew_budget`` set and the reading beyond it, the
    won claim is given back at once as CLOCK_UNCERTAIN (:class:`Held`).
    """
    claiming = _claiming(app)
    store = claiming.store
    if eager:
        store = _eager_store(store.using) or store
    owner = owner_name(hostname)
    detail = claim_detail(retries, limits)

    def claim() -> Lease | ClaimRefused:
        return store.runs.claim(
            task_id,
            retries,
            task_name=task_name,
            owner=owner,
            ttl=ttl,
            reserve=reserve,
            max_lost_leases=claiming.max_lost_leases,
            exclusive=exclusive,
            detail=detail,
        )

    started = clock.monotonic()
    try:
        outcome: Lease | ClaimRefused | Exception = claim()
    except CONNECTION_ERRORS as exc:
        outcome = exc
    if not isinstance(outcome, Lease):
        if isinstance(outcome, ClaimRefused) and outcome.why != ClaimRefused.MISSING:
            return outcome

        def record() -> None:
            store.outbox.enqueue(unrecorded())

        patience = Patience(ttl, started=started)
        outcome = _claim_patiently(patience, claim, outcome, record, task_id)
        if isinstance(outcome, ClaimRefused):
            return outcome
    budget = claiming.clock_skew_budget
    if budget is None:  # not measured: no skew budget to hold the run to
        return Attempt(store, outcome, owner, ttl, eager=eager)
    sent, answered = store.last_round_trip()  # the claim statement's own round trip
    reading = ClockReading.between(sent, outcome.database_now, answered)
    if gate(answered, reading, budget) is Readiness.CLOCK_UNCERTAIN:
        held = Held(reading, budget, recorded=False)
        recorded = store.runs.hold(outcome, owner, held.explain())
        return Held(reading, budget, recorded)
    return Attempt(store, outcome, owner, ttl, reading=reading, eager=eager)


def _claim_patiently(
    patience: Patience,
    claim: Callable[[], Lease | ClaimRefused],
    first: ClaimRefused | Exception,
    record: Callable[[], None],
    task_id: str,
) -> Lease | ClaimRefused:
    """The claim after a first try, made without a :class:`Patience` (most claims need
    none), that raised ``first`` or found no run (``first``, that refusal: ``record()``
    records the run first): tried again until ``patience`` is spent, then
    :class:`~celery_deadlines.errors.LedgerUnreachable`.

    A claim that meets a database blip must not fail the run: Celery would store the
    connection's error as the task's result while the run is still QUEUED, and a
    caller in get() would be told FAILURE of a run that later succeeds. A claim that
    committed with its answer lost is refused when tried again (the lease is held):
    its lease lapses and the reconciler requeues the run."""
    try:
        if isinstance(first, Exception):  # on as Patience.reach goes after a failed try
            if patience.spent():
                raise first
            patience.pause()
            outcome = patience.reach(claim)
        else:
            outcome = first
        if isinstance(outcome, ClaimRefused) and outcome.why == ClaimRefused.MISSING:
            patience.reach(record)
            return patience.reach(claim)
        return outcome
    except CONNECTION_ERRORS as exc:
        raise LedgerUnreachable(task_id, patience.waited(), repr(exc)) from exc


def refuse_run(
    app: Any,
    *,
    task_id: str,
    task_name: str,
    retries: int,
    status: Status,
    reason: str,
    detail: str,
    deadline: datetime | None,
    confirm_within: timedelta | None,
) -> Refusal:
    """A gate refused a message: end its run, unless it already ended or another worker
    owns it. Returns what this refusal did (:class:`~celery_deadlines.rules.records.Refusal`:
    true when it ended the run): only then may the caller store the refusal as the task's
    result (it must not overwrite another attempt's).

    ``confirm_within``: for a refusal for the deadline, the task's reserve: a recorded
    run ends only if the database clock agrees (the deadline, less the reserve, has
    passed by it), so a worker whose own clock ran ahead cannot expire work still in time.
    """
    return _attempts_store(app).runs.refuse(
        task_id,
        task_name,
        retries,
        status=status,
        reason=reason,
        detail=detail,
        deadline=deadline,
        confirm_within=confirm_within,
    )


def refuse_publish(
    app: Any,
    *,
    task_id: str,
    task_name: str,
    reason: str,
    detail: str,
    deadline: datetime | None,
) -> bool:
    """The enqueue gate refused a publish (nothing was sent): its run is recorded ended
    ``EXPIRED`` ``reason``, never published, so that a publish under its id again is
    judged again (:func:`~.outbox.record`). ``False``: the id is a run already recorded,
    which stands as it is (a refused repeat of a publish never ends the run it repeats)."""
    refused = NewRun(task_id=task_id, task_name=task_name, deadline=deadline)
    return store_for(app).outbox.record_ended(
        refused, Status.EXPIRED, reason, detail, "refuse_publish", published=False
    )


def end_owned(
    app: Any,
    *,
    task_id: str,
    hostname: str | None,
    pid: object,
    status: Status,
    reason: str,
    detail: str,
) -> str | None:
    """The worker's main process ends the attempt a pool process of its own holds (its
    hard time limit hit); see :class:`~celery_deadlines.ledger.sql.supervision.Supervision`."""
    store = store_for(app, dedicated=True)
    return store.supervision.end_owned(
        task_id, owner_name_of(hostname, pid), status, reason, detail
    )


def cancelled_running(app: Any, task_ids: Collection[str]) -> set[str]:
    """Of ``task_ids``, the runs the worker's main process supervises, those whose
    deadline a cancel pulled in (:func:`~celery_deadlines.core.cancelling.hard_limits_fall`)."""
    return store_for(app, dedicated=True).supervision.cancelled_running(task_ids)


def ended_run(app: Any, task_id: str) -> EndedRun | None:
    """How the run of ``task_id`` ended (its status, reason, detail and deadline), or
    ``None`` if it has not ended or is not recorded."""
    return _attempts_store(app).runs.ended(task_id)


def keep_result(app: Any, value: Any) -> KeptResult | None:
    """A success's return value to keep with the run's completion (:mod:`.results`)."""
    return _keep(app, value)


def read_result(app: Any, kept: KeptResult) -> Any:
    """A kept return value, decoded as :mod:`.results` allows (``UnreadableMessage``)."""
    return _read(app, kept)


def tell_caller_unknown(app: Any, task_id: str, error: str, task_name: str = "") -> None:
    """The run ended its attempt UNKNOWN: show the caller the Celery state ``UNKNOWN``,
    and (``task_name`` given: whoever ended it) page a person if no reconciler of the
    task can settle an effect (:func:`.operations.ask_for_operator`)."""
    store = store_for(app, dedicated=True)
    run_id = store.outbox.run_id(task_id)
    if run_id is not None:
        operations.tell_caller_unknown(app, store, run_id, task_id, error)
        if task_name:
            operations.ask_for_operator(app, store, run_id, task_id, task_name, error)


def lapse_owned(app: Any, task_id: str, hostname: str | None, pid: object, detail: str) -> bool:
    """A pool process of this worker was lost: let its lease lapse now and wake this
    worker's reconciler to settle the run. ``True`` when the ledger settles the run (and
    tells its caller); ``False`` when it ended already or is not recorded."""
    store = store_for(app, dedicated=True)
    lapsed = store.supervision.lapse_owned(task_id, owner_name_of(hostname, pid), detail)
    reconciler = running()
    if lapsed and reconciler is not None:
        reconciler.wake()
    return lapsed
