"""celery-deadlines: one deadline, stamped once, honoured by every hop of a Celery workflow.

The package in four tiers; each may import only the tiers above it in this list, and
``tests/unit/test_architecture.py`` holds it (every import, function-local ones too):

**Pure rules** (no clock read, no settings, no Celery, no Django; ``now`` is passed in):
``states`` (the vocabulary of states), ``errors``, ``wire`` (headers), ``budgets``
(durations, the precedence rule, the attempt's anchor), ``gates`` (every gate's rule),
``stamping`` (what a message carries), ``outcomes`` (how a run ends or moves), ``skew``,
``contracts``, ``observations``, ``plans``, ``schedules``, ``retention`` (how long
ended runs stay), ``incoming`` (a request's deadline headers and trust),
``workflows`` (does a chain, group or chord fit its deadline).

**The Celery tier** (reads the time only through ``clock``; the ledger only through
``ledger.api`` and ``ledger.operations``, inside functions): ``clock``, ``conf``,
``options`` (a task's durations), ``propagation`` (inheritance, scopes, the publish hook),
``ingress`` (a request's deadline: ``ingress_scope``), ``task`` (DeadlineTask: Celery's
hooks), ``canvas`` (the workflow gate), ``body`` (what a task body calls),
``claiming``, ``recording``, ``effects``, ``request`` (the worker's main process),
``signals``, ``beat``, ``metrics``, ``exporter`` (a worker serves the metrics),
``tracing`` (deadlines on OpenTelemetry spans), ``testing``.

**The ledger** (``ledger/``: Django's database, by raw conditional statements on the
database clock; never reaches back into the Celery tier's task side): ``api`` (the entry
point, plain values), ``operations`` (every operation that ends or moves a run, for the
reconciler, the admin and beat), ``attempt``, ``heartbeat``, ``outbox``, ``reconcile``,
``clockwatch``, ``worker``, ``retention`` (the purge), and ``sql/`` (the statements, by
audience).

**The Django app** (Django's own names): ``apps``, ``models``, ``admin``, ``checks``,
``explain``, ``management``, ``migrations``, ``middleware`` (a request's deadline).

See DEVELOPERS.md for the map, and docs/concepts.md for what each feature is.
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
    PlanRefused,
    RunConflict,
    RunFailed,
    StaleLease,
    WorkflowRefused,
)
from .gates import Gate, Reason
from .ingress import ingress_scope
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
    "InvalidEffect",
    "LedgerUnreachable",
    "Plan",
    "PlanRefused",
    "Reason",
    "RunConflict",
    "RunFailed",
    "StaleLease",
    "WorkflowRefused",
    "clock_certain",
    "clock_measured",
    "clock_uncertain",
    "deadline_refused",
    "deadline_scope",
    "dispatch_refused",
    "ingress_scope",
    "install",
    "plan_resumed",
    "run_claimed",
    "run_expired",
    "run_held",
    "write_refused",
]

__version__ = "0.1.0"
