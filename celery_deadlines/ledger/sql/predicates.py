"""SQL fragments shared by the ledger's statements, made from :mod:`celery_deadlines.rules.states`
so that each set of states and the claim's condition are written once.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from datetime import timedelta
from typing import Final

from ...rules.gates import Reason
from ...rules.states import CLAIMABLE, REQUEUEABLE, TERMINAL, UNRESOLVED, WAITING

RUN: Final = "celery_deadlines_run"
EVENT: Final = "celery_deadlines_runevent"
EFFECT: Final = "celery_deadlines_effect"
PLAN: Final = "celery_deadlines_runplan"

#: How long a lapsed lease is left to the worker that supervised it before anyone else
#: settles or claims it (that worker ends attempts killed by their time limit, and a
#: dispatch guard that passed while the lease was live has committed).
SUPERVISOR_GRACE: Final = timedelta(seconds=1)


def in_list(states: Iterable[enum.StrEnum]) -> str:
    """``('A', 'B')``: an SQL list of states, in their definition order."""
    ordered = sorted(states, key=_definition_order)
    return "(" + ", ".join(f"'{state.value}'" for state in ordered) + ")"


def _definition_order(state: enum.StrEnum) -> int:
    members: list[enum.StrEnum] = list(type(state).__members__.values())
    return members.index(state)


TERMINAL_SQL: Final = in_list(TERMINAL)
CLAIMABLE_SQL: Final = in_list(CLAIMABLE)
WAITING_SQL: Final = in_list(WAITING)
REQUEUEABLE_SQL: Final = in_list(REQUEUEABLE)
UNRESOLVED_SQL: Final = in_list(UNRESOLVED)
#: The reason a run ends for its deadline, by the run's row (``gates.expiry_reason``): a
#: cancelled run's deadline is the cancel's, and it ends ``cancelled`` whoever finds it past.
EXPIRY_REASON_SQL: Final = (
    f"(CASE WHEN reason = '{Reason.CANCELLED.value}' THEN '{Reason.CANCELLED.value}' "
    f"WHEN delivery_task THEN '{Reason.DELIVERY_EXPIRED.value}' "
    f"ELSE '{Reason.DEADLINE_PASSED.value}' END)"
)

#: True for the run row being written when one of its effects has no recorded outcome.
HAS_UNRESOLVED: Final = (
    f"EXISTS (SELECT 1 FROM {EFFECT} u WHERE u.run_id = {RUN}.id AND u.state IN {UNRESOLVED_SQL})"
)

#: The columns of a run's outbox message (``Sweeps._message`` reads them).
MESSAGE_COLUMNS: Final = (
    "id, task_id, task_name, version, retries, available_at, message_body, content_type, "
    "content_encoding"
)
EVENT_COLUMNS: Final = (
    "run_id, at, kind, outcome, status, reason, version, lease_token, owner, "
    "lease_expires_at, detail"
)


#: The claim's condition, once: ``(why, what must hold)`` in the order a refusal is
#: explained, as templates (:class:`~celery_deadlines.ledger.sql.statements.Sql`). The
#: claim's ``WHERE`` is all of them; a lost claim's reason is the first that does not
#: hold. Named parameters: ``task_name``, ``retries``, ``reserve`` (seconds, as the
#: dialect's ``now_plus`` takes them) and ``max_lost``.
CLAIM_CHECKS: Final = (
    # a run is its task's: a message naming another task takes nothing of it, whatever
    # the run's state (first: its refusal says so, never "terminal" or "held")
    ("task_mismatch", "task_name = %(task_name)s"),
    ("terminal", "status NOT IN {terminal}"),
    ("stale_message", "retries = %(retries)s"),
    # a lapsed attempt dispatched an effect with no recorded outcome: reconcile first
    # (the live lease tested first: a held run's refusal reads none of its effects)
    (
        "unresolved",
        "NOT (NOT (status = 'RUNNING' AND lease_expires_at > {now}) AND {has_unresolved})",
    ),
    # a cancelled run (its deadline pulled in by ``Operator.cancel``) is refused as
    # cancelled, not as past its deadline: its caller is told Celery's revoke
    ("cancelled", "reason <> 'cancelled'"),
    ("deadline_passed", "(deadline IS NULL OR deadline > {now})"),
    ("deadline", "(deadline IS NULL OR deadline > {now_plus:reserve})"),
    # a lapsed lease is taken over only after the grace: its supervisor ends it first
    # (a time limit), and a dispatch guard that passed while it was live has committed
    ("held", "NOT (status = 'RUNNING' AND lease_expires_at > {now_less_grace})"),
    ("lost_leases", "NOT (status = 'RUNNING' AND lost_leases >= %(max_lost)s)"),
    ("unknown", "status <> 'UNKNOWN'"),
    # last: a lost claim whose row meets every check raced a claim that changed it, and
    # is refused as "changed" too (the refusal's reason names it once, as its ELSE)
    ("changed", "(status IN {claimable} OR status = 'RUNNING')"),
)
