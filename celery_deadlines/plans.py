"""Where plans were imported from before the pure rules moved to ``rules/``: the names a
task body uses, kept here so that ``from celery_deadlines.plans import steps_of`` works."""

from .rules.plans import Assumption, Plan, Verdict, resume, steps_of

__all__ = ["Assumption", "Plan", "Verdict", "resume", "steps_of"]
