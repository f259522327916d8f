"""Side effects performed at most once per key: ``with self.effect(...) as fx``.

::

    @app.task(base=DeadlineTask, bind=True, budget=120)
    def charge(self, order_id, amount):
        with self.effect("charge", key=f"order-{order_id}:charge:v1",
                         fingerprint={"amount": amount}, not_sent=(ConnectionRefusedError,)) as fx:
            if fx.completed:                  # done before, by this or an earlier attempt
                return fx.result
            resp = provider.charge(amount, idempotency_key=fx.key, fencing_token=fx.fence)
            fx.succeed(resp.id)

    @charge.reconciler("charge")
    def find_charge(fx):                      # asked only when an outcome is ambiguous
        found = provider.lookup(idempotency_key=fx.key)
        return Found(found.id, evidence=found.url) if found else NotFound(evidence="lookup: none")

Entering the block records the intent and passes the **dispatch guard** (one
conditional write against the database clock: this attempt's token is current, its
lease alive, the deadline ahead), or raises :class:`DispatchRefused` and the call is
not made. Leaving it records the outcome: ``fx.succeed(result)`` (or a normal exit),
``fx.fail(error)`` for a definitive refusal, an exception listed in ``not_sent`` as
NOT_DISPATCHED (safe to try again), any other exception as UNKNOWN: the run then waits
for the task's reconciler (or an operator) before anything is retried.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from datetime import date, datetime, time
from decimal import Decimal
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final
from uuid import UUID

from ..clock import get_clock
from ..errors import DispatchRefused, EffectConflict, InvalidEffect, StaleLease
from ..ledger._crashpoints import hit
from ..rules.observations import ActionClass, Observation, earliest_expiry, stale
from ..rules.outcomes import Found, NotFound, PendingEffect
from ..rules.states import EffectState
from ..signals import dispatch_refused, write_refused
from . import telemetry

logger = logging.getLogger("celery_deadlines")

if TYPE_CHECKING:
    from ..ledger.attempt import Attempt


#: The longest name and key the effect ledger's columns hold.
MAX_NAME: Final = 128
MAX_KEY: Final = 255


def fingerprint_of(parameters: Any) -> str:
    """A stable digest of a request's parameters (canonical JSON, SHA-256).

    JSON values, plus datetimes, dates, times, decimals and UUIDs (as their text).
    Anything else raises ``TypeError``: its text could differ between processes (an
    object's default repr holds its address), and a retry would then look like a key
    reused with other parameters.
    """
    canonical = json.dumps(parameters, sort_keys=True, separators=(",", ":"), default=_as_text)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _as_text(value: Any) -> str:
    if isinstance(value, (datetime, date, time, Decimal, UUID)):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def checked(name: object, key: object, parameters: Any) -> tuple[str, str, str]:
    """``(name, key, fingerprint)`` of an effect, or :class:`InvalidEffect` saying which
    is wrong (checked before anything is recorded)."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise InvalidEffect(
            f"effect name must be a non-empty string of at most {MAX_NAME} characters, got {name!r}"
        )
    if not isinstance(key, str) or not key or len(key) > MAX_KEY:
        raise InvalidEffect(
            f"effect {name!r}: key must be a non-empty string of at most {MAX_KEY} "
            f"characters, got {key!r}"
        )
    try:
        fingerprint = fingerprint_of(parameters)
    except (TypeError, ValueError) as exc:
        raise InvalidEffect(
            f"effect {name!r} (key {key!r}): its fingerprint parameters cannot be recorded: {exc}"
        ) from exc
    return name, key, fingerprint


class EffectScope:
    """One side effect of the current attempt (see the module docstring)."""

    def __init__(
        self,
        attempt: Attempt,
        name: str,
        key: str,
        parameters: Any,
        *,
        not_sent: tuple[type[BaseException], ...] = (),
        kind: str = "execution",
        evidence: Sequence[Observation] = (),
        action: ActionClass | None = None,
        required: Sequence[str] = (),
    ) -> None:
        self.attempt = attempt
        self.name, self.key, self.fingerprint = checked(name, key, parameters)
        self.not_sent = not_sent
        self.kind = kind
        #: the observations the effect relies on, and what it does with them
        self.evidence = tuple(evidence)
        self.action = action
        self.required = tuple(required)
        #: the run's lease token (which attempt acts; it counts per run)
        self.token = attempt.lease.token
        #: this dispatch's number for the key (1, 2, ...), set by the guard: a fencing
        #: token per key, which grows even when the key passes to another run; give it
        #: to a provider that refuses a fence lower than one it has seen
        self.fence: int | None = None
        #: True when the effect already has an outcome (replayed, not called again)
        self.completed = False
        self.failed = False
        self.result: Any = None
        self._dispatched = False

    def __enter__(self) -> EffectScope:
        # a cancel's termination waits for the outcome of an effect being dispatched
        termination = self.attempt.termination
        if termination is None:
            return self._guard()
        termination.effect_begins()
        try:
            return self._guard()
        except BaseException:
            termination.effect_ended()
            raise

    def _guard(self) -> EffectScope:
        effects = self.attempt.effects
        lease = self.attempt.lease
        # the intent is one upsert: written again after a lost answer, it finds itself
        recorded = self.attempt.patiently(
            f"intent of {self.key}",
            lambda: effects.record_intent(lease, self.key, self.name, self.kind, self.fingerprint),
        )
        if recorded.fingerprint != self.fingerprint:
            raise EffectConflict(
                f"effect key {self.key!r} was first used with other parameters "
                f"(fingerprint {recorded.fingerprint[:12]}, now {self.fingerprint[:12]})"
            )
        if recorded.state in (EffectState.SUCCEEDED, EffectState.FAILED):
            self.completed = True
            self.failed = recorded.state == EffectState.FAILED
            self.result = recorded.result
            if not self.failed:
                self.attempt.performed[self.key] = self.name  # replayed: it was done
            return self
        if recorded.state in (EffectState.DISPATCHED, EffectState.UNKNOWN):
            raise self._refused("unresolved", f"state {recorded.state}")
        fresh_until = self._check_evidence()
        hit("effect.intent", self.attempt.lease.task_id)
        fence = self.attempt.patiently(
            f"dispatch of {self.key}",
            lambda: effects.dispatch(lease, self.key, fresh_until),
            done=self._dispatched_by_this_attempt,
        )
        if fence is None:
            lease, owner = self.attempt.lease, self.attempt.owner
            reason = effects.why_refused(lease, self.key, owner, fresh_until)
            raise self._refused(reason)
        self.fence = fence
        self._dispatched = True
        self.attempt.unresolved.add(self.key)
        self.attempt.effect_names[self.key] = self.name
        hit("effect.dispatched", self.attempt.lease.task_id)
        return self

    def _dispatched_by_this_attempt(self) -> int | None:
        """After a guard whose answer was lost: its dispatch number if it committed."""
        found = self.attempt.effects.state_of(self.key)
        if found is None:
            return None
        state, token, dispatches = found
        mine = state == EffectState.DISPATCHED and token == self.token
        return dispatches if mine else None

    def _outcome_written(self, state: str) -> bool | None:
        """After an outcome write whose answer was lost: ``True`` if it committed."""
        found = self.attempt.effects.state_of(self.key)
        return True if found is not None and found[:2] == (state, self.token) else None

    def _refused(self, reason: str, detail: str = "") -> DispatchRefused:
        """The guard's refusal, announced (:data:`~celery_deadlines.signals.dispatch_refused`;
        a stale lease's is also a refused write)."""
        task_id = self.attempt.lease.task_id
        refused = DispatchRefused(self.key, reason, detail)
        logger.warning("run %s: %s", task_id, refused)
        telemetry.record_dispatch_refusal(
            task_id=task_id, key=self.key, reason=reason, detail=detail
        )
        dispatch_refused.send(sender=self, task_id=task_id, key=self.key, reason=reason)
        if reason == "stale_lease":
            write_refused.send(sender=self, task_id=task_id, write="dispatch")
        return refused

    def _check_evidence(self) -> datetime | None:
        """Refuse stale evidence before the guard (the worker's view, with reasons); the
        guard then checks the earliest expiry against the database clock."""
        if self.action is None:
            return None
        lease = self.attempt.lease
        problems = stale(
            self.evidence,
            self.action,
            now=get_clock().now(),
            token=lease.token,
            required=self.required,
        )
        if problems:
            detail = "; ".join(problems)
            self.attempt.store.runs.record_rejected(
                lease.run_id,
                "dispatch",
                lease.token,
                self.attempt.owner,
                f"stale_evidence:{self.key}: {detail}"[:2000],
            )
            raise self._refused("stale_evidence", detail)
        return earliest_expiry(self.evidence, self.action)

    def succeed(self, result: Any = None) -> None:
        """Record what the provider returned (JSON-serialisable)."""
        self._record(self.attempt.effects.succeed, result, EffectState.SUCCEEDED)
        self.completed, self.result = True, result
        self.attempt.performed[self.key] = self.name

    def fail(self, error: str) -> None:
        """Record a definitive refusal by the provider: the effect will not be retried."""
        self._record(self.attempt.effects.fail, error, EffectState.FAILED)
        self.completed, self.failed = True, True

    def _record(self, write: Any, value: Any, state: str) -> None:
        if not self._dispatched:
            raise RuntimeError(f"effect {self.key} was not dispatched by this attempt")
        self._dispatched = False
        hit("effect.before_outcome", self.attempt.lease.task_id)
        lease = self.attempt.lease
        written = self.attempt.patiently(
            f"outcome of {self.key}",
            lambda: write(lease, self.key, value),
            done=lambda: self._outcome_written(state),
        )
        if not written:
            # settled meanwhile (reconciled, or dispatched again under a newer token):
            # this attempt's outcome is not the record; it is a stale holder
            lease = self.attempt.lease
            why = (
                f"effect {self.key} moved on since this attempt's dispatch {self.fence} "
                f"(token {self.token}): it is now {self.attempt.effects.describe(self.key)}"
            )
            self.attempt.store.runs.record_rejected(
                lease.run_id, "effect_outcome", self.token, self.attempt.owner, why
            )
            raise StaleLease(lease.task_id, self.token, f"outcome of {self.key}", why)
        self.attempt.unresolved.discard(self.key)
        hit("effect.recorded", self.attempt.lease.task_id)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        termination = self.attempt.termination
        if termination is None:
            return self._outcome(exc)
        try:
            return self._outcome(exc)
        finally:
            termination.effect_ended()  # a cancel learnt meanwhile terminates the body now

    def _outcome(self, exc: BaseException | None) -> None:
        if not self._dispatched:
            return
        effects = self.attempt.effects
        if exc is None:
            self.succeed(None)  # the call returned and nothing said otherwise
            return
        lease, error = self.attempt.lease, repr(exc)[:2000]
        if isinstance(exc, self.not_sent):
            self._dispatched = False
            self.attempt.patiently(
                f"outcome of {self.key}",
                lambda: effects.not_sent(lease, self.key, error),
                done=lambda: self._outcome_written(EffectState.NOT_DISPATCHED),
            )
            self.attempt.unresolved.discard(self.key)
        else:
            # a timeout, a reset, a soft time limit...: it may have happened (its write
            # may wait a lease for the database; if it cannot, the effect stays
            # DISPATCHED, which the reconciler reads as UNKNOWN: the same answer)
            self.attempt.patiently(
                f"outcome of {self.key}",
                lambda: effects.unknown(lease, self.key, error),
                done=lambda: self._outcome_written(EffectState.UNKNOWN),
            )


__all__ = ["EffectScope", "Found", "NotFound", "PendingEffect", "fingerprint_of"]
