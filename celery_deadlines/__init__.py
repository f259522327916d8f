"""celery-deadlines: one deadline, stamped once, honoured by every hop of a Celery workflow.

What is imported from here is the public surface. Where everything else lives, tier by
tier, and the life of a message through it: DEVELOPERS.md ("The tiers", which
``tests/repository/test_architecture.py`` holds, and "The life of a message").
"""

from .core.cancelling import cancel
from .core.ingress import ingress_scope
from .core.outbound import deadline_headers
from .core.propagation import deadline_scope
from .errors import (
    ConfigurationError,
    DeadlineError,
    DeadlineRefused,
    DispatchRefused,
    EffectConflict,
    InvalidDeadline,
    InvalidEffect,
    LedgerUnreachable,
    PerformedPastDeadline,
    PlanRefused,
    QueryCut,
    ReservedHeader,
    RunConflict,
    RunFailed,
    StaleLease,
    WorkflowRefused,
)
from .install import install
from .rules.gates import Gate, Reason
from .rules.outcomes import Found, NotFound, PendingEffect
from .rules.plans import Assumption, Plan, steps_of
from .rules.wire import (
    DEADLINE_HEADER,
    DELIVERY_DEADLINE_HEADER,
    ORIGIN_HEADER,
    SOURCE_HEADER,
)
from .signals import (
    clock_certain,
    clock_measured,
    clock_uncertain,
    deadline_refused,
    dispatch_refused,
    operator_needed,
    plan_resumed,
    run_claimed,
    run_expired,
    run_held,
    write_refused,
)
from .task import DeadlineTask

__all__ = [  # noqa: RUF022 (grouped by role, not sorted)
    # the task class and where deadlines start
    "DeadlineTask",
    "deadline_scope",
    "ingress_scope",
    "install",
    # a run cancelled with everything it started
    "cancel",
    # the deadline on the calls a body makes to other services
    "deadline_headers",
    # effects: what a reconciler answers
    "Found",
    "NotFound",
    "PendingEffect",
    # plans: what a paused run resumes from
    "Assumption",
    "Plan",
    "steps_of",
    # gates and their reasons
    "Gate",
    "Reason",
    # errors: one root, DeadlineError
    "DeadlineError",
    "ConfigurationError",
    "DeadlineRefused",
    "DispatchRefused",
    "EffectConflict",
    "InvalidDeadline",
    "InvalidEffect",
    "LedgerUnreachable",
    "PerformedPastDeadline",
    "PlanRefused",
    "QueryCut",
    "ReservedHeader",
    "RunConflict",
    "RunFailed",
    "StaleLease",
    "WorkflowRefused",
    # signals
    "clock_certain",
    "clock_measured",
    "clock_uncertain",
    "deadline_refused",
    "dispatch_refused",
    "operator_needed",
    "plan_resumed",
    "run_claimed",
    "run_expired",
    "run_held",
    "write_refused",
    # the wire format's header names
    "DEADLINE_HEADER",
    "DELIVERY_DEADLINE_HEADER",
    "ORIGIN_HEADER",
    "SOURCE_HEADER",
]

#: The version, written here only (pyproject.toml reads it: [tool.hatch.version]).
__version__ = "0.2.0"
