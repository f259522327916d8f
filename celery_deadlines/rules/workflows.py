"""Can a workflow (a chain, a group, a chord, nested) finish before its deadline? (pure)

A workflow is a tree of :class:`Step` (one task), :class:`Chain` (one after the other),
:class:`Group` (side by side) and :class:`Chord` (a group, then a body). What it needs
from the instant it is enqueued is its critical path, computed backwards from its end
(``then`` is what must still fit after a node)::

    step    countdown + max(reserve, attempt_timeout + then)
    chain   each step's need with the rest of the chain as its ``then``
    group   the largest of its members' (each followed by ``then``); empty: ``then``
    chord   the header's, followed by the body's

A step needs its ``reserve`` left when it starts (the enqueue and claim gates refuse it
otherwise) and its ``attempt_timeout`` to run, after which the rest starts; so
``max(reserve, attempt_timeout + then)``, the retry gate's rule for one more attempt
(:func:`celery_deadlines.rules.gates.allow_retry`). The workflow fits when its need is at most
the time left (``need == remaining`` still fits). A step without a declared attempt
timeout counts as zero and is named in the refusal's detail: the check is only as good
as the timeouts it is given. Nothing here reads a clock or a setting; the Celery glue
is :mod:`celery_deadlines.core.canvas`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple, TypeAlias

from .gates import Decision, Gate, Reason, seconds

ZERO = timedelta(0)


@dataclass(frozen=True)
class Step:
    """One task of a workflow. ``attempt_timeout`` ``None``: not declared (counts as zero)."""

    name: str
    attempt_timeout: timedelta | None = None
    reserve: timedelta = ZERO
    countdown: timedelta = ZERO


@dataclass(frozen=True)
class Chain:
    """Nodes run one after the other."""

    nodes: tuple[Node, ...]


@dataclass(frozen=True)
class Group:
    """Nodes run side by side; what follows waits for the last of them."""

    nodes: tuple[Node, ...]


@dataclass(frozen=True)
class Chord:
    """A header group, then the body (with the header's results)."""

    header: Group
    body: Node


Node: TypeAlias = Step | Chain | Group | Chord


class Need(NamedTuple):
    """Least time a node needs from its start, and the terms of its critical path."""

    total: timedelta
    terms: tuple[str, ...] = ()


NOTHING = Need(ZERO)


def need(node: Node, then: Need = NOTHING) -> Need:
    """What ``node`` needs from its start when ``then`` must still fit after it."""
    if isinstance(node, Step):
        timeout = node.attempt_timeout or ZERO
        if node.reserve > timeout + then.total:
            after = Need(node.reserve, (f"{node.name}: reserve {seconds(node.reserve)}",))
        elif timeout > ZERO:
            term = f"{node.name}: attempt timeout {seconds(timeout)}"
            after = Need(timeout + then.total, (term, *then.terms))
        else:
            after = then
        if node.countdown > ZERO:
            term = f"{node.name}: countdown {seconds(node.countdown)}"
            return Need(node.countdown + after.total, (term, *after.terms))
        return after
    if isinstance(node, Chain):
        for inner in reversed(node.nodes):
            then = need(inner, then)
        return then
    if isinstance(node, Group):
        longest: Need | None = None
        for inner in node.nodes:
            candidate = need(inner, then)
            if longest is None or candidate.total > longest.total:
                longest = candidate
        return then if longest is None else longest
    return need(node.header, need(node.body, then))


def steps(node: Node) -> Iterator[Step]:
    """Every step of ``node``, in the order they are written."""
    if isinstance(node, Step):
        yield node
    elif isinstance(node, (Chain, Group)):
        for inner in node.nodes:
            yield from steps(inner)
    else:
        yield from steps(node.header)
        yield from steps(node.body)


def undeclared(node: Node) -> list[str]:
    """Names of the steps without a declared attempt timeout (each once, in order)."""
    return list(dict.fromkeys(s.name for s in steps(node) if s.attempt_timeout is None))


def fit(node: Node, deadline: datetime, now: datetime) -> Decision:
    """May ``node``, enqueued at ``now``, finish by ``deadline``? Refused with
    ``workflow_cannot_fit`` when its critical path needs more than the time left; the
    detail has the arithmetic and the steps counted as zero."""
    remaining = deadline - now
    needed = need(node)
    if needed.total <= remaining:
        return Decision(Gate.ENQUEUE, None, deadline, now, remaining)
    path = " + ".join(needed.terms) or "no step declares a duration"
    left = (
        f"{seconds(remaining)} left"
        if remaining > ZERO
        else f"the deadline passed {seconds(-remaining)} ago"
    )
    detail = f"the workflow needs {seconds(needed.total)} ({path}) but {left}"
    zero = undeclared(node)
    if zero:
        detail += f"; no attempt timeout declared, counted as zero: {', '.join(zero)}"
    return Decision(
        gate=Gate.ENQUEUE,
        reason=Reason.WORKFLOW_CANNOT_FIT,
        deadline=deadline,
        clock_reading=now,
        remaining=remaining,
        detail=detail,
    )


__all__ = ["Chain", "Chord", "Group", "Need", "Node", "Step", "fit", "need", "steps", "undeclared"]
