"""``DeadlineTask``: the Celery glue for the enqueue, attempt and retry gates.

The claim gate and the time-limit cap run in the worker's main process, in
:class:`celery_deadlines.request.DeadlineRequest`; everything else is here. All rules
are in :mod:`celery_deadlines.gates`; this module gathers their inputs (settings, task
attributes, headers, the clock) and turns refusals into Celery outcomes:

* enqueue: :class:`DeadlineRefused` raised from ``apply_async``; nothing is published;
* attempt: the refusal is stored as the task's failure, then ``Ignore`` (body not run);
* retry: :class:`DeadlineRefused` raised from ``retry()``, so the run fails with
  ``retry_budget_exhausted`` instead of publishing a retry that would die unseen.

With the Django app installed the run ledger is the admission gate too
(:mod:`celery_deadlines.ledger`): ``apply_async`` records the run before publishing,
``before_start`` claims it (a lost claim, a duplicate delivery, runs nothing: ``Ignore``),
and ``__call__`` writes the outcome under the claim's fencing token. A stale attempt's
refused write (:class:`StaleLease`) also becomes ``Ignore``: it must not store a result
over the current owner's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from celery import Task
from celery.exceptions import Ignore, Reject, Retry
from celery.utils import uuid
from celery.utils.time import maybe_make_aware

from . import conf, gates, ledger, propagation, wire
from ._crashpoints import hit
from .budgets import UNSET, Anchor, Source, govern, parse_budget, parse_duration
from .clock import get_clock
from .conf import settings_for
from .errors import (
    ConfigurationError,
    DeadlineRefused,
    DispatchRefused,
    PlanRefused,
    StaleLease,
)
from .install import install
from .observations import ActionClass, Observation
from .plans import Plan, Verdict
from .plans import resume as resume_plan
from .propagation import ANCHOR, ATTEMPT, CARRIED, Inherited
from .signals import plan_resumed, report_refusal, run_claimed, run_held

if TYPE_CHECKING:
    from .effects import EffectScope
    from .ledger.attempt import Attempt
    from .ledger.sql.rows import Lease

#: ``reconciler(pending_effect) -> Found | NotFound``
Reconciler = Callable[[Any], Any]

logger = logging.getLogger("celery_deadlines")


class DeadlineTask(Task):  # type: ignore[type-arg]
    """A Celery task that honours one deadline, stamped once and inherited everywhere.

    Task options (``@app.task(base=DeadlineTask, ...)``), each overriding the task's
    time contract (``deadlines_contracts``) and the settings:

    ``budget``           seconds or timedelta from the first publish; ``None``: no deadline
    ``delivery_budget``  the same for the delivery deadline
    ``reserve``          least time that must be left for the task to start
    ``attempt_timeout``  what one attempt may take, reserved by the retry gate
                         (default: ``time_limit``, then the setting)
    ``lease_ttl``        how long a claim owns the run before it must be renewed
                         (Django tier; default: the ``deadlines_lease_ttl`` setting)
    ``deadline_kind``    ``"execution"`` (default) or ``"delivery"``: a delivery task
                         (a notification) published from a run is governed by that
                         run's *delivery* deadline, so it may run after execution
                         expired, and is refused with ``delivery_expired`` after it

    Call options (``apply_async(budget=...)``): ``budget`` or ``deadline`` (an aware
    datetime), ``delivery_budget`` or ``delivery_deadline``.
    """

    Request = "celery_deadlines.request:DeadlineRequest"

    budget: ClassVar[object] = UNSET
    delivery_budget: ClassVar[object] = UNSET
    reserve: ClassVar[object] = UNSET
    attempt_timeout: ClassVar[object] = UNSET
    lease_ttl: ClassVar[object] = UNSET
    deadline_kind: ClassVar[str] = "execution"
    #: ``{effect name: reconciler}``, as a task option (or register with ``@task.reconciler``)
    reconcilers: ClassVar[dict[str, Any]] = {}

    @classmethod
    def bind(cls, app: Any) -> Any:
        install()  # the publish hook that stamps children; idempotent
        return super().bind(app)

    # -- enqueue gate --------------------------------------------------------------

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> Any:
        """Publish with the governing deadline, or raise :class:`DeadlineRefused`.

        Raises :class:`InvalidDeadline` for bad call options (naive datetime, negative
        or absurd budget, both ``budget`` and ``deadline``) and
        :class:`ConfigurationError` for a bad setting. Either way nothing is published.
        """
        settings = settings_for(self.app)
        now = get_clock().now()
        given = options.get("headers")
        headers = dict(given) if given else {}
        parent = propagation.inherited()
        if self.deadline_kind == "delivery":
            # a notification lives by the delivery deadline, never by the execution one
            parent = parent._replace(deadline=parent.delivery)
        if parent.unreadable is not None:
            detail = "the parent task's deadline is unreadable"
            self._refuse_enqueue(gates.invalid(gates.Gate.ENQUEUE, now, detail), task_id)
        own, own_source, own_delivery = self._own_deadlines(options, headers, now, settings)
        governed = govern(own, own_source, parent.deadline, parent.source)
        if governed.clamped_from is not None and own_source == "call":
            propagation.log_clamp(self.name, task_id, governed)
        if governed.deadline is not None:
            decision = gates.admit(
                gates.Gate.ENQUEUE,
                governed.deadline,
                now,
                self.reserve_duration(settings),
                starts_at=_start_of(options, now),
            )
            if not decision.allowed:
                self._refuse_enqueue(decision, task_id)
            # Celery's expires header only: a broker-side TTL would drop the message
            # without a recorded reason (see docs/failure-semantics.md).
            headers["expires"] = propagation.earlier_expiry(
                options.get("expires"), governed.deadline, now
            ).isoformat()
        origin = parent.origin if governed.source in ("parent", "scope") else None
        delivery = propagation.earlier(own_delivery, parent.delivery)
        propagation.stamp(headers, governed, delivery, origin)
        if headers:
            options["headers"] = headers
        if not ledger.enabled_for(self.app) or self.app.conf.task_always_eager:
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **options
            )
        from .ledger import glue

        task_id = task_id or uuid()

        def send() -> Any:
            return Task.apply_async(
                self, args, kwargs, task_id, producer, link, link_error, shadow, **options
            )

        return glue.publish(
            self,
            self._attempt(),
            args,
            kwargs,
            task_id,
            link,
            link_error,
            shadow,
            options,
            governed.deadline,
            delivery,
            _start_of(options, now),
            send,
        )

    def _own_deadlines(
        self,
        options: dict[str, Any],
        headers: dict[str, Any],
        now: datetime,
        settings: conf.Settings,
    ) -> tuple[datetime | None, Source | None, datetime | None]:
        """This publish's own execution deadline (with its source) and delivery deadline."""
        own: datetime | None = None
        own_source: Source | None = None
        own_delivery: datetime | None = None
        if not propagation.CALL_OPTIONS.isdisjoint(options):
            horizon = settings.max_budget
            own = propagation.call_instant(options, "", now, horizon)
            own_source = "call" if own is not None else None
            own_delivery = propagation.call_instant(options, "delivery_", now, horizon)
        if own is None and wire.DEADLINE_HEADER in headers:
            # an explicit header, or the one retry() copied from the original message
            own = wire.decode(headers[wire.DEADLINE_HEADER], now=now, horizon=settings.max_budget)
            own_source = headers.get(wire.SOURCE_HEADER, "call")
        if own is None:
            own_source, budget = self._configured(
                "budget", conf.DEFAULT_BUDGET, conf.BUDGETS, settings
            )
            own = None if budget is None else now + budget
        if own_delivery is None:
            _, delivery_budget = self._configured(
                "delivery_budget", conf.DEFAULT_DELIVERY_BUDGET, None, settings
            )
            own_delivery = None if delivery_budget is None else now + delivery_budget
        return own, own_source if own is not None else None, own_delivery

    def _configured(
        self,
        attribute: str,
        default: conf.Setting[timedelta | None],
        per_task: conf.Setting[dict[str, timedelta | None]] | None,
        settings: conf.Settings,
    ) -> tuple[Source | None, timedelta | None]:
        """Task attribute > contract > per-task setting > default setting: a budget and
        its source."""
        raw = getattr(self, attribute, UNSET)
        if raw is not UNSET:
            return "task", self._parsed_attribute(attribute, raw, settings)
        contracted = self._contracted(attribute, settings)
        if contracted is not UNSET:
            return "setting", contracted
        if per_task is not None:
            budgets = settings.get(per_task)
            if self.name in budgets:
                return "setting", budgets[self.name]
        return "default", settings.get(default)

    def _contracted(self, key: str, settings: conf.Settings) -> Any:
        """The value ``deadlines_contracts`` gives this task for ``key``, or UNSET."""
        contract = settings.contract_of(self.name)
        return UNSET if contract is None else getattr(contract, key)

    def _parsed_attribute(
        self, attribute: str, raw: object, settings: conf.Settings
    ) -> timedelta | None:
        """A task attribute duration, parsed once per value (attributes rarely change)."""
        cache: dict[str, tuple[object, timedelta | None]] = self.__dict__.setdefault(
            "_celery_deadlines_parsed", {}
        )
        cached = cache.get(attribute)
        if cached is not None and cached[0] is raw:
            return cached[1]
        name = f"{self.name}.{attribute}"
        parsed = (
            parse_duration(raw, name=name, allow_zero=True)
            if attribute == "reserve"
            else parse_budget(raw, name=name, maximum=settings.max_budget)
        )
        cache[attribute] = (raw, parsed)
        return parsed

    def _refuse_enqueue(self, decision: gates.Decision, task_id: str | None) -> NoReturn:
        decision = self.kind_of(decision)
        report_refusal(self, task_id, self.name, decision)
        refusal = decision.refusal()
        if ledger.enabled_for(self.app) and not self.app.conf.task_always_eager:
            from .ledger import glue
            from .states import Status

            # the refused run is on record too (under a fresh id if the caller gave none)
            glue.refuse(
                self, task_id or uuid(), 0, Status.EXPIRED, refusal.reason, str(refusal),
                decision.deadline, dedicated=False,
            )  # fmt: skip
        raise refusal

    # -- durations from task attributes and settings -------------------------------------

    def reserve_duration(self, settings: conf.Settings | None = None) -> timedelta:
        """The reserve: least time left for this task to start (attribute, then setting)."""
        settings = settings or settings_for(self.app)
        if self.reserve is UNSET:
            contracted = self._contracted("reserve", settings)
            if contracted is not UNSET:
                return contracted  # type: ignore[no-any-return]
            return settings.get(conf.DEFAULT_RESERVE)
        return self._parsed_attribute("reserve", self.reserve, settings) or timedelta(0)

    def lease_duration(self) -> timedelta:
        """How long a claim owns the run: ``lease_ttl``, the contract, else the setting."""
        if self.lease_ttl is UNSET:
            settings = settings_for(self.app)
            contracted = self._contracted("lease_ttl", settings)
            if contracted is not UNSET:
                return contracted  # type: ignore[no-any-return]
            return settings.get(conf.LEASE_TTL)
        return parse_duration(self.lease_ttl, name=f"{self.name}.lease_ttl")

    def attempt_duration(self) -> timedelta:
        """What one attempt may take: ``attempt_timeout``, the contract's, ``time_limit``,
        the setting, or 0."""
        settings = settings_for(self.app)
        if self.attempt_timeout is UNSET:
            contracted = self._contracted("attempt_timeout", settings)
            if contracted is not UNSET:
                return contracted  # type: ignore[no-any-return]
        for name in ("attempt_timeout", "time_limit", "soft_time_limit"):
            value = getattr(self, name, None)
            if value is not UNSET and value is not None:
                return parse_duration(value, name=f"{self.name}.{name}")
        configured = settings.get(conf.DEFAULT_ATTEMPT_TIMEOUT)
        return configured if configured is not None else timedelta(0)

    # -- attempt gate (runs in the pool process, right before the body) ----------------

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        """Anchor the attempt's budget on the monotonic clock, or refuse to start it."""
        request = self.request
        clock = get_clock()
        now = clock.now()
        # read together: the budget is anchored at this instant, whatever the claim takes
        started = clock.monotonic()
        headers = request.headers or {}
        carried = propagation.read_headers(headers, now, settings_for(self.app).max_budget, task_id)
        state = vars(request)
        state[CARRIED] = carried
        state[ANCHOR] = None
        state[ATTEMPT] = None
        if carried.unreadable is not None:
            detail = f"unreadable deadline header {carried.unreadable!r}"
            self._refuse_attempt(gates.invalid(gates.Gate.ATTEMPT, now, detail), task_id)
        reserve = self.reserve_duration()
        deadline = carried.deadline
        with_ledger = ledger.enabled_for(self.app) and not request.is_eager
        # With a clock-skew budget the ledger's clock decides (seed 001's gate order:
        # CLOCK_UNCERTAIN before EXPIRED): the claim measures this clock against it,
        # holds the run if they disagree, and checks the deadline by the database clock.
        skew_budget = settings_for(self.app).get(conf.CLOCK_SKEW_BUDGET) if with_ledger else None
        if deadline is not None and skew_budget is None:
            decision = gates.admit(gates.Gate.ATTEMPT, deadline, now, reserve)
            if not decision.allowed:
                self._refuse_attempt(decision, task_id)
        if with_ledger:
            hit("claim.before", task_id)
            attempt = self._claim(task_id, deadline, reserve, now)
            hit("claim.after", task_id)
            state[ATTEMPT] = attempt
            if attempt.lease.deadline is not None and (
                deadline is None or attempt.lease.deadline < deadline
            ):
                # the ledger's deadline is the authority; a header can only shorten it
                deadline = attempt.lease.deadline
                state[CARRIED] = carried._replace(deadline=deadline)
            if skew_budget is not None and attempt.reading is not None:
                now = attempt.reading.corrected(now)  # remaining time by the ledger's clock
            attempt.start()
        if deadline is not None:
            state[ANCHOR] = Anchor.at(deadline, now, started)

    def _claim(
        self, task_id: str, deadline: datetime | None, reserve: timedelta, now: datetime
    ) -> Attempt:
        """Claim the run in the ledger, or end this delivery without running the body."""
        from .ledger import glue
        from .ledger.sql.rows import ClaimRefused

        request = self.request
        outcome = glue.claim(self, request, deadline, reserve)
        if isinstance(outcome, glue.Held):
            self._hold(task_id, outcome)
        if not isinstance(outcome, ClaimRefused):
            lease = outcome.lease
            if lease.waiting_since is not None:
                run_claimed.send(
                    sender=self, task_id=task_id, task_name=self.name,
                    queue_wait=max(lease.database_now - lease.waiting_since, timedelta(0)),
                )  # fmt: skip
            return outcome
        if outcome.why == ClaimRefused.DEADLINE:
            passed = deadline is not None and deadline <= now
            reason = gates.Reason.DEADLINE_PASSED if passed else gates.Reason.INSUFFICIENT_BUDGET
            detail = "refused by the ledger's clock"
            self._refuse_attempt(
                gates.Decision(gates.Gate.CLAIM, reason, deadline, now, None, detail),
                task_id,
            )
        if outcome.why == ClaimRefused.LOST_LEASES:
            from billiard.exceptions import WorkerLostError

            from .states import Status

            detail = "the run lost its lease too many times (deadlines_max_lost_leases)"
            if glue.refuse(
                self, task_id, request.retries or 0, Status.FAILED, "worker_lost", detail, deadline
            ):
                self.backend.mark_as_failure(
                    task_id, WorkerLostError(detail), request=request,
                    store_result=self._stores_errors(),
                )  # fmt: skip
            raise Ignore(detail)
        logger.info(
            "%s[%s]: delivery not run, claim refused (%s); run is %s, token %s, owner %s",
            self.name, task_id, outcome.why, outcome.status or "unrecorded",
            outcome.token, outcome.owner or "none",
        )  # fmt: skip
        raise Ignore(f"claim refused: {outcome.why}")

    def _hold(self, task_id: str, held: Any) -> NoReturn:
        """This worker's clock is beyond the skew budget: the run was given back as
        CLOCK_UNCERTAIN (not failed, not expired) for a worker whose clock agrees."""
        logger.warning(
            "%s[%s]: not started, held as CLOCK_UNCERTAIN: %s%s",
            self.name, task_id, held.explain(),
            "" if held.recorded else " (the hold was not recorded; the reconciler settles it)",
        )  # fmt: skip
        run_held.send(
            sender=self, task_id=task_id, task_name=self.name, reading=held.reading,
            budget=held.budget,
        )  # fmt: skip
        raise Ignore(f"clock uncertain: {held.explain()}")

    def kind_of(self, decision: gates.Decision) -> gates.Decision:
        """The decision in this task's terms (a delivery task's deadline is its delivery)."""
        return gates.as_delivery(decision) if self.deadline_kind == "delivery" else decision

    def _refuse_attempt(self, decision: gates.Decision, task_id: str) -> NoReturn:
        decision = self.kind_of(decision)
        report_refusal(self, task_id, self.name, decision)
        refusal = decision.refusal()
        if ledger.enabled_for(self.app) and not self.request.is_eager:
            from .ledger import glue
            from .states import Status

            if not glue.refuse(
                self, task_id, self.request.retries or 0, Status.EXPIRED,
                refusal.reason, str(refusal), decision.deadline,
            ):  # fmt: skip
                # already ended, or another attempt owns the run: its result stands
                raise Ignore(str(refusal))
        self.backend.mark_as_failure(
            task_id, refusal, request=self.request, store_result=self._stores_errors()
        )
        raise Ignore(str(refusal))

    # -- the body, and its outcome written under the claim's token --------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        attempt = self._attempt()
        state = vars(self.request_stack.top) if attempt is not None else {}
        if attempt is None or state.get(_IN_BODY):
            # no ledger, or the body calling its own task directly: a plain call
            return super().__call__(*args, **kwargs)
        state[_IN_BODY] = True
        # Called by Celery's tracer, which already pushed the request and the task.
        try:
            try:
                try:
                    result = self.run(*args, **kwargs)
                finally:
                    attempt.stop()  # no renewal may follow the attempt's final write
                if attempt.unresolved:
                    _end_unresolved(attempt)
                attempt.succeed()
                hit("run.completed", self.request.id)
                return result
            except (Retry, StaleLease, _Unresolved, _Paused):
                raise  # written by apply_async / by nobody (stale) / as UNKNOWN / PAUSED
            except BaseException as exc:
                _end_after_body(attempt, exc)
                raise
        except StaleLease as exc:
            logger.warning("%s[%s]: %s; nothing stored", self.name, self.request.id, exc)
            raise Ignore(str(exc)) from exc

    # -- side effects (the effect ledger) -------------------------------------------------

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
        """A side effect performed at most once per ``key`` (see :mod:`celery_deadlines.effects`).

        ``fingerprint``: the request's parameters; the same key with other parameters
        raises :class:`EffectConflict`. ``not_sent``: exceptions that prove the request
        never left (recorded NOT_DISPATCHED); any other exception records UNKNOWN.
        ``evidence`` and ``action``: the observations the effect relies on and its action
        class (``inform``, ``recommend``, ``reserve``, ``commit``); the guard refuses
        stale evidence with ``DispatchRefused(stale_evidence)`` (see
        :mod:`celery_deadlines.observations`). A ``commit`` also needs every source the
        task's contract lists in ``revalidate_before``.
        """
        from .effects import EffectScope

        attempt = self._ledger_attempt("side effects")
        if evidence and action is None:
            raise ConfigurationError(
                f"effect {name!r} has evidence but no action class: say what it is for "
                "(action='inform', 'recommend', 'reserve' or 'commit')"
            )
        action_class = None if action is None else ActionClass(action)
        contract = settings_for(self.app).contract_of(self.name)
        required = contract.revalidate_before if contract is not None else ()
        return EffectScope(
            attempt, name, key, fingerprint, not_sent, kind or self.deadline_kind,
            evidence, action_class, required,
        )  # fmt: skip

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
            source, value, now, now + lifetime, evidence_id,
            token=lease.token if lease is not None else 0,
            source_updated_at=source_updated_at,
        )  # fmt: skip

    # -- plans (seed 003: a resumed plan must earn the right to continue) -----------------

    def save_plan(self, plan: Plan) -> None:
        """Store ``plan`` as the run's active plan, fenced by this attempt's token (the
        previous one is kept as superseded history). Raises :class:`StaleLease` if the
        attempt no longer owns the run."""

        attempt = self._ledger_attempt("plans")
        saved = attempt.store.plans.save(attempt.lease, attempt.owner, plan.plan_id, plan.to_json())
        attempt.check_written(saved, "save_plan")

    def resume_plan(self, current: Mapping[str, Any]) -> Verdict | None:
        """The resume gate: may the run's stored plan go on, given the ``current`` facts?

        ``None``: the run has no active plan (a first attempt, or its last plan was
        invalidated), so the body plans from fresh observations. Otherwise the plan is
        checked by :func:`celery_deadlines.plans.resume` at the *ledger's* time. A plan
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
        from .contracts import OnExpiry
        from .states import Status

        attempt = self._ledger_attempt("plans")
        plans = attempt.store.plans
        stored = plans.active(attempt.lease.run_id)
        if stored is None:
            return None
        verdict = resume_plan(
            Plan.from_json(stored.document), attempt.store.database_now(), current
        )
        contract = settings_for(self.app).contract_of(self.name)
        on_expiry = contract.on_expiry if contract is not None else OnExpiry.REFUSE
        action = "continue" if verdict.may_execute else on_expiry.value
        task_id = attempt.lease.task_id
        plan_resumed.send(
            sender=self, task_id=task_id, task_name=self.name, verdict=verdict, action=action
        )
        if verdict.may_execute:
            return verdict
        detail = verdict.explain()
        invalidated = plans.invalidate(
            attempt.lease, attempt.owner, stored.row_id, verdict.reason, detail
        )
        attempt.check_written(invalidated, "invalidate_plan")
        if on_expiry is OnExpiry.REVALIDATE:
            logger.info("%s[%s]: plan invalidated (%s); revalidating", self.name, task_id, detail)
            return verdict
        if on_expiry is OnExpiry.REFUSE:
            raise PlanRefused(verdict.reason, detail, verdict.plan.plan_id)
        if attempt.unresolved:
            _end_unresolved(attempt)  # an unknown outcome is settled before anything else
        escalated = on_expiry is OnExpiry.ESCALATE
        said = f"{detail}; {'escalated to an operator' if escalated else 'paused'}"
        attempt.end(Status.PAUSED, verdict.reason, said)
        logger.log(
            logging.ERROR if escalated else logging.WARNING,
            "%s[%s]: run PAUSED (%s): %s", self.name, task_id, verdict.reason, said,
        )  # fmt: skip
        raise _Paused(said)

    def ledger_now(self) -> datetime:
        """The ledger's clock (the database's; one read) in a ledger attempt, else this
        process's: what a plan's ``created_at`` and an observation's stamp are read from,
        so the resume gate and the dispatch guard judge them by the same clock."""
        attempt = self._attempt()
        return attempt.store.database_now() if attempt is not None else get_clock().now()

    def _ledger_attempt(self, feature: str) -> Attempt:
        attempt = self._attempt()
        if attempt is None:
            raise ConfigurationError(
                f"{feature} need the run ledger: add 'celery_deadlines' to INSTALLED_APPS "
                "and run the task in a worker"
            )
        return attempt

    def reconciler(self, name: str) -> Callable[[Reconciler], Reconciler]:
        """Register the function asked about an effect of this task whose outcome is unknown.

        It gets a :class:`~celery_deadlines.effects.PendingEffect` and returns ``Found``
        (with the result to replay and the evidence) or ``NotFound`` (with evidence).
        """

        def register(function: Reconciler) -> Reconciler:
            self.__dict__.setdefault("_effect_reconcilers", {})[name] = function
            return function

        return register

    def effect_reconciler(self, name: str) -> Reconciler | None:
        """The reconciler of effect ``name``: registered with ``@task.reconciler``, or
        given as the task option ``reconcilers={name: function}``."""
        registered: dict[str, Reconciler] = self.__dict__.get("_effect_reconcilers", {})
        found = registered.get(name) or self.reconcilers.get(name)
        return found if callable(found) else None

    def _attempt(self) -> Attempt | None:
        """The ledger attempt of the delivery this process is executing, if any."""
        request = self.request_stack.top
        if request is None:
            return None
        attempt: Attempt | None = vars(request).get(ATTEMPT)
        return attempt

    def checkpoint(self, name: str, data: Any = None) -> None:
        """Persist progress under the current lease (Django tier).

        ``data`` must be JSON-serialisable. Raises :class:`StaleLease` if the attempt
        no longer owns the run; without the ledger it is a no-op.
        """
        attempt = self._attempt()
        if attempt is not None:
            attempt.checkpoint(name, data)

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

    def _stores_errors(self) -> bool:
        # Celery's own rule (trace.py): errors are stored unless results are ignored,
        # and then only with store_errors_even_if_ignored.
        ignore_result = self.request.ignore_result
        if ignore_result is None:
            ignore_result = self.ignore_result
        return bool(self.store_errors_even_if_ignored or not ignore_result)

    # -- what the body can ask ------------------------------------------------------------

    @property
    def deadline(self) -> datetime | None:
        """The current attempt's execution deadline (aware UTC), or ``None``."""
        carried = vars(self.request).get(CARRIED)
        return carried.deadline if isinstance(carried, Inherited) else None

    def remaining(self) -> float:
        """Seconds left before the deadline, on the monotonic clock (``inf``: no deadline).

        Negative once the deadline has passed. Measured from the attempt's anchor, so a
        wall clock change during the attempt does not change the answer.
        """
        anchor = vars(self.request).get(ANCHOR)
        if not isinstance(anchor, Anchor):
            return math.inf
        return anchor.remaining(get_clock().monotonic()).total_seconds()

    # -- retry gate -----------------------------------------------------------------------

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: Exception | None = None,
        throw: bool = True,
        eta: datetime | None = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Any:
        """``Task.retry``, refused with ``retry_budget_exhausted`` when it cannot finish.

        The rule: ``countdown + attempt_timeout + clock_skew_allowance <= remaining``
        (autoretry's backoff and jitter arrive here as ``countdown``). A refused retry
        raises :class:`DeadlineRefused`, chained to ``exc``, so the run fails with that
        reason. The retried message keeps the original absolute deadline.
        """
        attempt = self._attempt()
        if attempt is not None and attempt.unresolved:
            _end_unresolved(attempt, exc)  # never retry blindly after an ambiguous call
        anchor = vars(self.request).get(ANCHOR)
        if isinstance(anchor, Anchor) and not self._retries_exhausted(max_retries):
            clock = get_clock()
            now = clock.now()
            if eta is not None:
                wait = max(eta - now, timedelta(0))
            else:
                seconds = self.default_retry_delay if countdown is None else countdown
                wait = timedelta(seconds=max(float(seconds or 0), 0.0))
            decision = gates.allow_retry(
                anchor.deadline,
                now,
                anchor.remaining(clock.monotonic()),
                wait,
                self.attempt_duration(),
                settings_for(self.app).get(conf.CLOCK_SKEW_ALLOWANCE),
                self.reserve_duration(),
            )
            if not decision.allowed:
                if exc is not None:
                    decision = gates.Decision(
                        decision.gate,
                        decision.reason,
                        decision.deadline,
                        decision.clock_reading,
                        decision.remaining,
                        f"{decision.detail}; last error {exc!r}",
                    )
                report_refusal(self, self.request.id, self.name, decision)
                raise decision.refusal() from exc
        return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)

    def _retries_exhausted(self, max_retries: int | None) -> bool:
        limit = self.max_retries if max_retries is None else max_retries
        return limit is not None and self.request.retries + 1 > limit


def _end_unresolved(attempt: Attempt, exc: BaseException | None = None) -> NoReturn:
    """UNKNOWN is not FAILED: the run waits for its effects to be reconciled."""
    from .states import Status

    keys = ", ".join(sorted(attempt.unresolved))
    detail = f"outcome unknown for effect(s) {keys}" + (f" after {exc!r}" if exc else "")
    attempt.end(Status.UNKNOWN, "effect_unresolved", detail[:2000])
    logger.warning("run %s: %s; reconcile before retrying", attempt.lease.task_id, detail)
    raise _Unresolved(detail)


def _end_after_body(attempt: Attempt, exc: BaseException) -> None:
    """Write the run's outcome for a body that raised ``exc``, as Celery reads ``exc``
    (the caller re-raises it). With an effect dispatched and no outcome known, whatever
    was raised, the run ends UNKNOWN and :class:`_Unresolved` is raised instead: never
    FAILED, never released to run again."""
    from .states import Status

    if attempt.unresolved:
        _end_unresolved(attempt, exc)
    if isinstance(exc, Ignore):
        attempt.end(Status.SUCCEEDED, "ignored", "the task raised Ignore")
    elif isinstance(exc, Reject):
        why = getattr(exc, "reason", None)
        if getattr(exc, "requeue", False):
            attempt.release(f"rejected with requeue: {why!r}")
        else:
            attempt.end(Status.FAILED, "rejected", f"rejected: {why!r}")
    elif isinstance(exc, DeadlineRefused):
        attempt.end(Status.EXPIRED, exc.reason, str(exc))
    elif isinstance(exc, PlanRefused):
        attempt.end(Status.FAILED, exc.reason, str(exc))
    elif isinstance(exc, DispatchRefused):
        # another run's dispatch of the key is unresolved (refused for the deadline or a
        # stale lease, this write is refused too: the reconciler settles the run)
        attempt.end(Status.FAILED, "dispatch_refused", str(exc))
    else:
        attempt.end(Status.FAILED, "error", repr(exc)[:2000])


class _Unresolved(Ignore):
    """The attempt ended with an effect of unknown outcome: the run is now UNKNOWN."""


class _Paused(Ignore):
    """The run's resumed plan may not go on and its contract pauses: it is now PAUSED."""


#: Set on the request while the tracer runs the body of a ledger attempt.
_IN_BODY = "celery_deadlines_in_body"


def _start_of(options: dict[str, Any], now: datetime) -> datetime | None:
    """When a message may first start: its ``eta`` or ``countdown``, else ``None``."""
    eta = options.get("eta")
    if isinstance(eta, datetime):
        aware: datetime = maybe_make_aware(eta)  # as Celery reads a naive eta
        return aware
    countdown = options.get("countdown")
    if isinstance(countdown, (int, float)) and not isinstance(countdown, bool):
        return now + timedelta(seconds=countdown)
    return None
