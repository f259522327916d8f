"""celery-deadlines: one deadline, stamped once, honoured by every hop of a Celery workflow.

The folders are the tiers (DEVELOPERS.md, "The tiers", draws the map;
``tests/unit/test_architecture.py`` holds it, reading each module's tier from its path):
``rules/`` the pure rules (no clock, no Celery, no Django: ``now`` is passed in); the
package root the Celery tier (``task``, ``propagation``, ``claiming``, ...), which
reads the time only through ``clock``; ``ledger/`` the run ledger on Django's
database; and the Django app under Django's own names (``apps``, ``models``, ``admin``,
``checks``, ``middleware``, ``explain``, ``management``). ``errors`` is every tier's.
"""

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
    ReservedHeader,
    RunConflict,
    RunFailed,
    StaleLease,
    WorkflowRefused,
)
from .ingress import ingress_scope
from .install import install
from .outbound import deadline_headers
from .propagation import deadline_scope
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

__version__ = "0.1.0"
