"""celery-deadlines: one deadline, stamped once, honoured by every hop of a Celery workflow."""

from .errors import (
    ConfigurationError,
    DeadlineError,
    DeadlineRefused,
    DispatchRefused,
    EffectConflict,
    InvalidDeadline,
    PlanRefused,
    StaleLease,
)
from .gates import Gate, Reason
from .install import install
from .plans import Assumption, Plan
from .propagation import deadline_scope
from .signals import (
    clock_certain,
    clock_measured,
    clock_uncertain,
    deadline_refused,
    dispatch_refused,
    plan_resumed,
    run_claimed,
    run_expired,
    run_held,
    write_refused,
)
from .task import DeadlineTask
from .wire import (
    DEADLINE_HEADER,
    DELIVERY_DEADLINE_HEADER,
    ORIGIN_HEADER,
    SOURCE_HEADER,
)

__all__ = [
    "DEADLINE_HEADER",
    "DELIVERY_DEADLINE_HEADER",
    "ORIGIN_HEADER",
    "SOURCE_HEADER",
    "Assumption",
    "ConfigurationError",
    "DeadlineError",
    "DeadlineRefused",
    "DeadlineTask",
    "DispatchRefused",
    "EffectConflict",
    "Gate",
    "InvalidDeadline",
    "Plan",
    "PlanRefused",
    "Reason",
    "StaleLease",
    "clock_certain",
    "clock_measured",
    "clock_uncertain",
    "deadline_refused",
    "deadline_scope",
    "dispatch_refused",
    "install",
    "plan_resumed",
    "run_claimed",
    "run_expired",
    "run_held",
    "write_refused",
]

__version__ = "0.1.0"
