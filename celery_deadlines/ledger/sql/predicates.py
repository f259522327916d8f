"""The SQL the ledger's statements name as slots (``{terminal}``, ``{has_unresolved}``...:
:mod:`.statements`), made from :mod:`celery_deadlines.rules` so that each set of states and
each of the rules' conditions is written once.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from datetime import timedelta
from typing import Final

from ...rules.gates import Reason
from ...rules.states import CLAIMABLE, REQUEUEABLE, TERMINAL, UNRESOLVED, WAITING

RUN: Final = "celery_deadlines_run"
EFFECT: Final = "celery_deadlines_effect"

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

#: What an eager run's end says of itself (its ``op_detail``): a run whose caller was
#: told in its own process, never through the result backend.
EAGER_RUN: Final = "eager run"
EAGER_RUN_SQL: Final = f"'{EAGER_RUN}'"

#: True for the run row being written when one of its effects has no recorded outcome.
HAS_UNRESOLVED: Final = (
    f"EXISTS (SELECT 1 FROM {EFFECT} u WHERE u.run_id = {RUN}.id AND u.state IN {UNRESOLVED_SQL})"
)
