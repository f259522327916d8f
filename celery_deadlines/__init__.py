"""celery-deadlines: one deadline, stamped once, honoured by every hop of a Celery workflow."""

from .errors import ConfigurationError, DeadlineError, DeadlineRefused, InvalidDeadline
from .gates import Gate, Reason
from .install import install
from .propagation import deadline_scope
from .signals import clock_certain, clock_uncertain, deadline_refused
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
    "ConfigurationError",
    "DeadlineError",
    "DeadlineRefused",
    "DeadlineTask",
    "Gate",
    "InvalidDeadline",
    "Reason",
    "clock_certain",
    "clock_uncertain",
    "deadline_refused",
    "deadline_scope",
    "install",
]

__version__ = "0.1.0"
