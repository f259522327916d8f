"""Observations: a fact, where it came from, when it was seen, and until when it may be
trusted, so that freshness is checked by code at the side-effect boundary
(docs/explanation/time-contracts.md, "Observations and action classes").

An :class:`Observation` is an envelope (value, source, observed_at, expires_at,
evidence_id, and the lease token of the attempt that made it). Its timestamps are set
once, when it is made, and are never refreshed: a run that resumes from a checkpoint
restores the envelope as it was, so an old fact stays old. To trust a fact again, read
the source again and make a new observation.

How fresh a fact must be depends on what it is used for (the action class):

=============  ==========================================  ===============================
class          example                                     what the dispatch guard checks
=============  ==========================================  ===============================
``inform``     explain a policy                            nothing: any recorded evidence
``recommend``  suggest a delivery slot                     each observation within its TTL
``reserve``    hold a slot or stock                        within TTL, and observed by the
                                                           attempt that acts (re-read now)
``commit``     charge, delete, change an account           as ``reserve``, and every source
                                                           the contract's
                                                           ``revalidate_before`` names
=============  ==========================================  ===============================

The rules here are pure (:func:`stale`); the guard applies the TTLs once more against
the database clock, in its one conditional write, so a worker with a wrong clock cannot
pass stale evidence (refusal reason ``stale_evidence``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .budgets import parse_instant


class ActionClass(enum.StrEnum):
    """What an effect does with its evidence, which decides how fresh it must be."""

    INFORM = "inform"
    RECOMMEND = "recommend"
    RESERVE = "reserve"
    COMMIT = "commit"


@dataclass(frozen=True, slots=True)
class Observation:
    """One observed fact. Make it with ``DeadlineTask.observe()``; never re-stamp it."""

    source: str
    value: Any
    observed_at: datetime
    expires_at: datetime
    evidence_id: str
    #: the lease token of the attempt that observed it (0 outside the ledger)
    token: int = 0
    source_updated_at: datetime | None = None

    def __post_init__(self) -> None:
        for name in ("observed_at", "expires_at"):
            parse_instant(getattr(self, name), name=f"observation {self.source!r} {name}")
        if self.expires_at <= self.observed_at:
            raise ValueError(f"observation {self.source!r} expires before it was observed")

    def fresh_at(self, now: datetime) -> bool:
        return self.expires_at > now

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (for checkpoints); :meth:`from_json` restores it unchanged."""
        return {
            "source": self.source,
            "value": self.value,
            "observed_at": self.observed_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
            "evidence_id": self.evidence_id,
            "token": self.token,
            "source_updated_at": (
                self.source_updated_at.isoformat() if self.source_updated_at else None
            ),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Observation:
        """The observation as it was made: its timestamps are not refreshed."""
        updated = data.get("source_updated_at")
        return cls(
            source=data["source"],
            value=data["value"],
            observed_at=datetime.fromisoformat(data["observed_at"]),
            expires_at=datetime.fromisoformat(data["expires_at"]),
            evidence_id=data["evidence_id"],
            token=int(data.get("token") or 0),
            source_updated_at=datetime.fromisoformat(updated) if updated else None,
        )


def stale(
    evidence: Iterable[Observation],
    action: ActionClass,
    *,
    now: datetime,
    token: int,
    required: Iterable[str] = (),
) -> list[str]:
    """Why ``evidence`` may not support ``action`` now, one line per problem (empty: it
    may). ``token`` is the acting attempt's lease token; ``required`` the sources that
    must be present (the contract's ``revalidate_before``, for ``commit``)."""
    evidence = list(evidence)
    problems: list[str] = []
    if action is ActionClass.COMMIT:
        present = {observation.source for observation in evidence}
        problems += [f"{source}: not observed" for source in required if source not in present]
    if action is ActionClass.INFORM:
        return problems
    for observation in evidence:
        if not observation.fresh_at(now):
            problems.append(
                f"{observation.source}: expired at {observation.expires_at.isoformat()} "
                f"(observed {observation.observed_at.isoformat()}, {observation.evidence_id})"
            )
        elif action in (ActionClass.RESERVE, ActionClass.COMMIT) and observation.token != token:
            problems.append(
                f"{observation.source}: observed by an earlier attempt (token "
                f"{observation.token}); a {action.value} re-reads its source first"
            )
    return problems


def earliest_expiry(evidence: Iterable[Observation], action: ActionClass) -> datetime | None:
    """The instant the guard checks against the database clock (``None``: no TTL applies)."""
    if action is ActionClass.INFORM:
        return None
    return min((observation.expires_at for observation in evidence), default=None)
