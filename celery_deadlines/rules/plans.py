"""Plans that must earn the right to continue when a run resumes
(docs/explanation/time-contracts.md).

A :class:`Plan` is what a run decided to do (its steps), the typed assumptions that
decision rested on, when it was made and until when it may be followed. It is kept with
the run (a checkpoint holds ``to_json()``). When the run resumes, :func:`resume` checks
it against the clock and against the world as it is *now*, and answers one of:

* ``continue``: within its validity and every assumption still holds;
* ``revalidate`` (reason ``plan_expired``): its validity ended; read the world again
  before deciding anything;
* ``replan`` (reason ``assumption_changed``): an assumption no longer holds (which
  ones, expected and found): the plan is history and must not be executed.

The checks are typed predicates, not a model's opinion: an :class:`Assumption` names a
fact, the value it expected, and how to compare (equal, or one of several values). A
plan that does not continue is kept as evidence (:attr:`Verdict.plan`), never executed.
Pure: the caller reads the current facts and the time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from .budgets import parse_instant


@dataclass(frozen=True, slots=True)
class Assumption:
    """``key`` must (still) be ``expected``, or one of ``expected`` when ``one_of``.

    ``key`` names a fact the body reads again when it resumes (the ``current`` mapping
    given to ``self.resume_plan(current)``); ``expected`` is JSON-serialisable (with
    ``one_of``: a collection of values, never a string). Raises ``ValueError`` for a
    ``one_of`` given a string.
    """

    key: str
    expected: Any
    one_of: bool = False

    def __post_init__(self) -> None:
        if self.one_of and isinstance(self.expected, (str, bytes)):
            raise ValueError(f"assumption {self.key!r}: one_of needs a collection of values")
        if self.one_of or isinstance(self.expected, list):
            # JSON has no tuples: keep one form, so a plan compares the same after a
            # checkpoint round trip
            object.__setattr__(self, "expected", _frozen(self.expected))

    def holds(self, found: Any) -> bool:
        """Whether ``found``, the fact read now, is what the plan assumed."""
        found = _frozen(found)
        if self.one_of:
            return bool(found in self.expected)
        return bool(found == self.expected)


@dataclass(frozen=True, slots=True)
class Plan:
    """Steps decided at ``created_at`` from ``assumptions``, valid until ``valid_until``.

    ``steps``: what the run will do, each a JSON-serialisable mapping; ``assumptions``:
    the assumptions (:class:`Assumption`) it was decided on; ``created_at`` and ``valid_until``:
    aware datetimes, read from ``self.ledger_now()`` so that the resume gate judges them
    by the ledger's clock; ``plan_id``: the name it is stored and shown under. Stored
    with ``self.save_plan(plan)``. Raises ``ValueError`` when ``valid_until`` is not
    after ``created_at``, and :class:`~celery_deadlines.InvalidDeadline` for a naive
    datetime.
    """

    steps: tuple[Mapping[str, Any], ...]
    assumptions: tuple[Assumption, ...]
    created_at: datetime
    valid_until: datetime
    plan_id: str = ""

    def __post_init__(self) -> None:
        parse_instant(self.created_at, name="plan created_at")
        parse_instant(self.valid_until, name="plan valid_until")
        if self.valid_until <= self.created_at:
            raise ValueError("a plan must be valid for some time after it is made")

    def to_json(self) -> dict[str, Any]:
        return {
            "plan_id": self.plan_id,
            "steps": [dict(step) for step in self.steps],
            "assumptions": [
                {"key": a.key, "expected": a.expected, "one_of": a.one_of} for a in self.assumptions
            ],
            "created_at": self.created_at.isoformat(),
            "valid_until": self.valid_until.isoformat(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        """The plan as it was made: resuming never moves ``created_at`` or ``valid_until``."""
        return cls(
            steps=tuple(data["steps"]),
            assumptions=tuple(
                Assumption(a["key"], _expected(a), bool(a.get("one_of")))
                for a in data["assumptions"]
            ),
            created_at=datetime.fromisoformat(data["created_at"]),
            valid_until=datetime.fromisoformat(data["valid_until"]),
            plan_id=data.get("plan_id", ""),
        )


def _expected(data: Mapping[str, Any]) -> Any:
    return data["expected"]


def _frozen(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(item) for item in value)
    return value


@dataclass(frozen=True, slots=True)
class Changed:
    """An assumption that no longer holds: what was expected and what is there now."""

    key: str
    expected: Any
    found: Any


@dataclass(frozen=True, slots=True)
class Verdict:
    """What resuming ``plan`` may do: ``kind`` and a reason the user can read."""

    kind: Literal["continue", "revalidate", "replan"]
    reason: str  # "", "plan_expired" or "assumption_changed"
    plan: Plan
    changed: tuple[Changed, ...] = field(default=())

    @property
    def may_execute(self) -> bool:
        return self.kind == "continue"

    def explain(self) -> str:
        if self.kind == "continue":
            return "the plan is still valid and its assumptions hold"
        if self.kind == "revalidate":
            return (
                f"the plan expired at {self.plan.valid_until.isoformat()} while the run was "
                "paused; the facts must be read again before acting"
            )
        details = "; ".join(f"{c.key} was {c.expected!r}, is now {c.found!r}" for c in self.changed)
        return f"the plan no longer applies: {details}"


class _Missing:
    def __repr__(self) -> str:
        return "<not found>"


#: What :class:`Changed` reports for a fact the caller could not read.
MISSING: Any = _Missing()


def resume(plan: Plan, now: datetime, current: Mapping[str, Any]) -> Verdict:
    """Decide whether a resumed ``plan`` may go on, at ``now``, given ``current`` facts.

    Expiry is checked first: an expired plan is revalidated even if its assumptions
    happen to hold, since nothing vouches for facts read after it expired. A fact
    missing from ``current`` counts as changed.
    """
    parse_instant(now, name="now")
    if now >= plan.valid_until:
        return Verdict("revalidate", "plan_expired", plan)
    changed = tuple(
        Changed(a.key, a.expected, current.get(a.key, MISSING))
        for a in plan.assumptions
        if not a.holds(current.get(a.key, MISSING))
    )
    if changed:
        return Verdict("replan", "assumption_changed", plan, changed)
    return Verdict("continue", "", plan)


def steps_of(verdict: Verdict) -> Sequence[Mapping[str, Any]]:
    """The steps ``verdict`` (what ``self.resume_plan()`` returned) allows to execute:
    the plan's if it may continue, else an empty sequence."""
    return verdict.plan.steps if verdict.may_execute else ()
