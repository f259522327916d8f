"""Where local-time schedules were imported from before the pure rules moved to
``rules/``; ``celery_deadlines.beat`` exports the same names beside ``ZonedSchedule``."""

from .rules.schedules import WEEKDAYS, Backlog, LocalSchedule, Occurrence, classify, occurrences

__all__ = ["WEEKDAYS", "Backlog", "LocalSchedule", "Occurrence", "classify", "occurrences"]
