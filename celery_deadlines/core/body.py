"""What a task body may ask of its attempt: ``self.remaining()``, ``self.lease``,
``self.checkpoint()``, ``self.effect()``, ``self.observe()``, plans and reconcilers.

:class:`AttemptAPI` is the half of :class:`~celery_deadlines.task.DeadlineTask` a body
calls; the other half (``task.py``) is Celery's hooks. Everything here reads the
attempt's state (:func:`celery_deadlines.core.propagation.attempt_state`), set by
``before_start``; without the ledger the ledger's features say what they need.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from celery.exceptions import Ignore

from .. import ledger
from ..clock import get_clock
from ..conf import settings_for
from ..errors import ConfigurationError, PlanRefused
from ..rules import outcomes
from ..rules.budgets import parse_duration
from ..rules.contracts import OnExpiry
from ..rules.observations import ActionClass, Observation
from ..rules.plans import Plan, Verdict
from ..rules.plans import resume as resume_plan
from ..rules.states import CALLER_UNKNOWN, Status
from ..signals import plan_resumed, report_operator_needed
from .claiming import result_policy
from .propagation import attempt_state

if TYPE_CHECKING:
    from ..ledger.attempt import Attempt
    from ..ledger.sql.rows import Lease
    from .effects import EffectScope

#: ``reconciler(pending_effect) -> Found | NotFound``
Reconciler = Callable[[Any], Any]

logger = logging.getLogger("celery_deadlines")


class Unresolved(Ignore):
    """The attempt ended with an effect of unknown outcome: the run is now UNKNOWN.
    ``args``: the detail, and the keys of the effects whose outcome is unknown (what
    the worker's ``task-unknown`` event names)."""

    @property
    def keys(self) -> list[str]:
        return list(self.args[1]) if len(self.args) > 1 else []


class Paused(Ignore):
    """The run's resumed plan may not go on and its contract pauses: it is now PAUSED."""


def end_unresolved(
    attempt: Attempt, exc: BaseException | None = None, *, task: Any = None
) -> NoReturn:
    """UNKNOWN is not FAILED: the run waits for its effects to be reconciled. The
    caller's result says so at once (the Celery state ``UNKNOWN``, naming the effects),
    until the settled outcome replaces it."""
    outcome = outcomes.unresolved(attempt.unresolved, exc)
    attempt.end(Status.UNKNOWN, outcome.reason, outcome.detail)
    logger.warning("run %s: %s; reconcile before retrying", attempt.lease.task_id, outcome.detail)
    if task is not None and result_policy(task).stores_errors:
        meta = outcomes.unknown_meta(attempt.unresolved, repr(exc) if exc else outcome.detail)
        task.backend.store_result(attempt.lease.task_id, meta, CALLER_UNKNOWN, request=task.request)
    if task is not None:
        names = {key: attempt.effect_names.get(key, "") for key in attempt.unresolved}
        alone = outcomes.needing_an_operator(names, lambda name: bool(task.effect_reconciler(name)))
        if alone:
            report_operator_needed(task, attempt.lease.task_id, task.name, alone, outcome.detail)
    raise Unresolved(outcome.detail, sorted(attempt.unresolved))


class AttemptAPI:
    """The methods a DeadlineTask's body calls (mixed into :class:`DeadlineTask`, and
    into no other task: the Celery tier tells a DeadlineTask apart by it, never
    importing the class, which is the public surface's)."""

    if TYPE_CHECKING:  # provided by celery.Task
        name: str
        app: Any
        request: Any
        request_stack: Any
        reconcilers: ClassVar[dict[str, Any]]
        deadline_kind: ClassVar[str]

    # -- time ----------------------------------------------------------------------------

    @property
    def deadline(self) -> datetime | None:
        """The current attempt's execution deadline (aware UTC), or ``None``."""
        state = attempt_state(self)
        return state.carried.deadline if state is not None else None

    def remaining(self) -> float:
        """Seconds left before the deadline, on the monotonic clock (``inf``: no deadline).

        Negative once the deadline has passed. Measured from the attempt's anchor, so a
        wall clock change during the attempt does not change the answer.
        """
        state = attempt_state(self)
        if state is None or state.anchor is None:
            return math.inf
        return state.anchor.remaining(get_clock().monotonic()).total_seconds()

    def ledger_now(self) -> datetime:
        """The ledger's clock (the database's; one read) in a ledger attempt, else this
        process's: what a plan's ``created_at`` and an observation's stamp are read from,
        so the resume gate and the dispatch guard judge them by the same clock."""
        attempt = self._attempt()
        return attempt.database_now() if attempt is not None else get_clock().now()

    # -- the lease and checkpoints ---------------------------------------------------------

    @property
    def lease(self) -> Lease | None:
        """The ledger lease this attempt claimed (token, expiry, attempt number), if any."""
        attempt = self._attempt()
        return attempt.lease if attempt is not None else None

    @property
    def last_checkpoint(self) -> tuple[str, Any] | None:
        """``(name, data)`` of the last durable checkpoint when this attempt was claimed."""
        attempt = self._attempt()
        return attempt.last_checkpoint if attempt is not None else None

    def checkpoint(self, name: str, data: Any = None) -> None:
        """Persist progress under the current lease (Django tier).

        ``data`` must be JSON-serialisable. Raises :class:`StaleLease` if the attempt
        no longer owns the run; without the ledger it is a no-op.
        """
        attempt = self._attempt()
        if attempt is not None:
            attempt.checkpoint(name, data)

    # -- side effects (the effect ledger) ----------------------------------------------------

    def effect(
        self,
        name: str,
        *,
        key: str,
        fingerprint: Any = None,
        not_sent: tuple[type[BaseException], ...] = (),
        kind: str | None = None,
        evidence: Sequence[Observation] = (),
        action: ActionClass | str | None = None,
    ) -> EffectScope:
        """A side effect performed at most once per ``key`` (:mod:`~celery_deadlines.core.effects`).

        ``fingerprint``: the request's parameters; the same key with other parameters
        raises :class:`EffectConflict`. ``not_sent``: exceptions that prove the request
        never left (recorded NOT_DISPATCHED); any other exception records UNKNOWN.
        ``evidence`` and ``action``: the observations the effect relies on and its action
        class (``inform``, ``recommend``, ``reserve``, ``commit``); the guard refuses
        stale evidence with ``DispatchRefused(stale_evidence)`` (see
        :mod:`celery_deadlines.rules.observations`). A ``commit`` also needs every source the
        task's contract lists in ``revalidate_before``.
        """
        from .effects import EffectScope

        attempt = self._ledger_attempt("side effects")
        if evidence and action is None:
            raise ConfigurationError(
                f"effect {name!r} has evidence but no action class: say what it is for "
                "(action='inform', 'recommend', 'reserve' or 'commit')"
            )
        contract = settings_for(self.app).contract_of(self.name)
        return EffectScope(
            attempt,
            name,
            key,
            fingerprint,
            not_sent=not_sent,
            kind=kind or self.deadline_kind,
            evidence=evidence,
            action=None if action is None else ActionClass(action),
            required=contract.revalidate_before if contract is not None else (),
        )

    def reconciler(self, name: str) -> Callable[[Reconciler], Reconciler]:
        """Register the function asked about an effect of this task whose outcome is unknown.

        It gets a :class:`~celery_deadlines.core.effects.PendingEffect` and returns ``Found``
        (with the result to replay and the evidence) or ``NotFound`` (with evidence).
        """

        def register(function: Reconciler) -> Reconciler:
            registered: dict[str, Reconciler] | None = getattr(self, "_effect_reconcilers", None)
            if registered is None:
                registered = {}
                self._effect_reconcilers = registered
            registered[name] = function
            return function

        return register

    def effect_reconciler(self, name: str) -> Reconciler | None:
        """The reconciler of effect ``name``: registered with ``@task.reconciler``, or
        given as the task option ``reconcilers={name: function}``."""
        registered: dict[str, Reconciler] = getattr(self, "_effect_reconcilers", None) or {}
        found = registered.get(name) or self.reconcilers.get(name)
        return found if callable(found) else None

    # -- observations ------------------------------------------------------------------------

    def observe(
        self,
        source: str,
        value: Any,
        *,
        evidence_id: str,
        ttl: float | timedelta | None = None,
        source_updated_at: datetime | None = None,
    ) -> Observation:
        """Record that ``value`` was just read from ``source``: an :class:`Observation`
        valid for ``ttl`` (default: the contract's ``observation_ttl[source]``), stamped
        with this attempt's token and, with the ledger, the database clock (one read).
        Keep it (a checkpoint may hold ``to_json()``) and pass it as an effect's
        ``evidence``; to trust the source again, observe it again."""
        if ttl is None:
            contract = settings_for(self.app).contract_of(self.name)
            if contract is None or source not in contract.observation_ttl:
                raise ConfigurationError(
                    f"no TTL for observation source {source!r}: pass ttl= or set "
                    f"CELERY_DEADLINES_CONTRACTS[{self.name!r}]['observation_ttl']"
                    f"[{source!r}] (deadlines_contracts)"
                )
            lifetime = contract.observation_ttl[source]
        else:
            lifetime = parse_duration(ttl, name=f"ttl of observation {source!r}")
        attempt = self._attempt()
        # the database clock when there is a ledger: the guard checks expiry by it too,
        # and a worker clock stepped forward or back must not age or rejuvenate evidence
        now = self.ledger_now()
        lease = attempt.lease if attempt is not None else None
        return Observation(
            source,
            value,
            now,
            now + lifetime,
            evidence_id,
            token=lease.token if lease is not None else 0,
            source_updated_at=source_updated_at,
        )

    # -- plans (a resumed plan must earn the right to continue: docs/explanation/time-contracts.md)

    def save_plan(self, plan: Plan) -> None:
        """Store ``plan`` as the run's active plan, fenced by this attempt's token (the
        previous one is kept as superseded history). Raises :class:`StaleLease` if the
        attempt no longer owns the run."""
        self._ledger_attempt("plans").save_plan(plan.plan_id, plan.to_json())

    def resume_plan(self, current: Mapping[str, Any]) -> Verdict | None:
        """The resume gate: may the run's stored plan go on, given the ``current`` facts?

        ``None``: the run has no active plan (a first attempt, or its last plan was
        invalidated), so the body plans from fresh observations. Otherwise the plan is
        checked by :func:`celery_deadlines.rules.plans.resume` at the *ledger's* time. A plan
        that continues is returned. One that does not is invalidated (kept as history,
        never executed) and the contract's ``on_expiry`` decides (default ``refuse``):

        * ``revalidate``: the verdict is returned; re-read the world and save a new plan
          (``steps_of(verdict)`` is empty);
        * ``refuse``: raises :class:`PlanRefused`; the run ends FAILED with the reason;
        * ``pause`` / ``escalate``: the run becomes PAUSED with the reason and waits for
          a person (the admin's *requeue*) or its deadline; ``escalate`` also logs an
          ERROR. The body stops here (Celery's ``Ignore``; no result is stored).

        Every call sends :data:`~celery_deadlines.signals.plan_resumed`.
        """
        attempt = self._ledger_attempt("plans")
        stored = attempt.active_plan()
        if stored is None:
            return None
        verdict = resume_plan(Plan.from_json(stored.document), attempt.database_now(), current)
        contract = settings_for(self.app).contract_of(self.name)
        on_expiry = contract.on_expiry if contract is not None else OnExpiry.REFUSE
        step = outcomes.after_plan(verdict.may_execute, on_expiry)
        task_id = attempt.lease.task_id
        plan_resumed.send(
            sender=self, task_id=task_id, task_name=self.name, verdict=verdict, action=step.value
        )
        if step is outcomes.PlanStep.CONTINUE:
            return verdict
        detail = verdict.explain()
        attempt.invalidate_plan(stored.row_id, verdict.reason, detail)
        if step is outcomes.PlanStep.REVALIDATE:
            logger.info("%s[%s]: plan invalidated (%s); revalidating", self.name, task_id, detail)
            return verdict
        if step is outcomes.PlanStep.REFUSE:
            refused = PlanRefused(verdict.reason, detail, verdict.plan.plan_id)
            logger.warning("%s[%s]: %s", self.name, task_id, refused)
            raise refused
        if attempt.unresolved:
            end_unresolved(attempt, task=self)  # an unknown outcome is settled first
        escalated = step is outcomes.PlanStep.ESCALATE
        said = f"{detail}; {'escalated to an operator' if escalated else 'paused'}"
        attempt.end(Status.PAUSED, verdict.reason, said)
        logger.log(
            logging.ERROR if escalated else logging.WARNING,
            "%s[%s]: run PAUSED (%s): %s",
            self.name,
            task_id,
            verdict.reason,
            said,
        )
        raise Paused(said)

    # -- the attempt ---------------------------------------------------------------------------

    def _attempt(self) -> Attempt | None:
        """The ledger attempt of the delivery this process is executing, if any."""
        state = attempt_state(self)
        return state.attempt if state is not None else None

    def _ledger_attempt(self, feature: str) -> Attempt:
        attempt = self._attempt()
        if attempt is None:
            raise ConfigurationError(f"{feature} {_why_no_attempt(self)}")
        return attempt


#: How a test runs a body with a claimed attempt and no database (docs/howto/testing.md).
IN_MEMORY = (
    "or test it against the in-memory ledger (celery_deadlines.testing.use_ledger("
    "FakeLedger()), or pytest_plugins = ['celery_deadlines.pytest_plugin'])"
)


def _why_no_attempt(task: Any) -> str:
    """Why this delivery of ``task`` has no claimed attempt, and what gives it one: the
    ledger is off (the Django app, or this Celery app's ``deadlines_ledger``), or no
    attempt runs in this thread (a direct call). Every run through Celery is claimed,
    an eager one (``task_always_eager``, ``apply()``) too."""
    if not ledger.enabled_for(task.app):
        if not ledger.active():
            return (
                "need the run ledger: add 'celery_deadlines' to INSTALLED_APPS (a worker's "
                f"runs and eager ones are claimed there), {IN_MEMORY}"
            )
        return (
            "need the run ledger, which this Celery app turned off (deadlines_ledger = "
            f"False): turn it on, {IN_MEMORY}"
        )
    return (
        "need a claimed attempt, and none runs here: a direct call (task(...)) claims "
        "none, nor does a thread the body starts; run the task through Celery (delay(), "
        "apply_async(), apply())"
    )
