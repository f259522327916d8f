"""The time limits one attempt is given, who set each, and the record its claim keeps.

What Celery applies to a job, without this library: the message's own limit
(``apply_async(time_limit=...)``), else the task's ``time_limit`` (declared on the
task; from Celery 5.7 also the app's ``task_time_limit``, which Celery copies onto a
task that declares none), else the pool's default, the worker's (``--time-limit``,
else ``task_time_limit``). The soft limit alike (:func:`celery_applies`). A deadline
only shortens them: the attempt gate hands the pool the least of those and the time
left (:func:`~celery_deadlines.rules.gates.cap_time_limits`), and a limit shorter than
Celery's is the deadline's (:func:`given`).

The claim records what its attempt was given in its event's detail
(:func:`claim_detail`), which ``explain`` reads back (:func:`read_claim`): a run's
history says what each attempt had, whatever the explaining process's settings.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple, cast

#: Who set a limit: the message (``apply_async(time_limit=...)``), the task's own
#: declaration, the app's ``task_time_limit``/``task_soft_time_limit``, the worker's
#: ``--time-limit``/``--soft-time-limit``, or the deadline (the attempt gate's cap).
MESSAGE: Final = "message"
TASK: Final = "task"
APP: Final = "app"
WORKER: Final = "worker"
DEADLINE: Final = "deadline"
#: Who sets a limit Celery applies on its own.
CELERY_SOURCES: Final = frozenset({MESSAGE, TASK, APP, WORKER})

#: A task's time limit attributes (Celery's).
TASK_LIMITS: Final = ("time_limit", "soft_time_limit")
#: A task class's attribute that keeps, by name, the limits Celery copied onto it from
#: the app's settings when it bound it (Celery 5.7: ``task_time_limit`` and
#: ``task_soft_time_limit`` onto a task that declares none; see
#: ``celery_deadlines.timelimits.note_app_copies``).
APP_COPIES: Final = "_celery_deadlines_app_copies"


def own_limit(task: object, name: str) -> object:
    """The task's own ``time_limit`` or ``soft_time_limit`` (``name``): what it declares,
    ``None`` for the app's setting Celery copied onto it (:data:`APP_COPIES`): a limit
    for every task of the app, not a measure of what one attempt of this one takes."""
    value = getattr(task, name, None)
    copies = getattr(task, APP_COPIES, None)
    if isinstance(copies, dict) and name in copies and value == copies[name]:
        return None
    return value


class Given(NamedTuple):
    """One limit an attempt was given: ``seconds`` (``None``: none) and who set it; for
    one the deadline set, what Celery would have given instead (``None``: nothing)."""

    seconds: float | None
    source: str | None
    instead: float | None = None
    instead_source: str | None = None


class AttemptLimits(NamedTuple):
    """The hard and soft limits one attempt was given; ``eager``: an eager run
    (``apply()``), to which Celery applies no time limit."""

    hard: Given
    soft: Given
    eager: bool = False


NO_LIMIT: Final = Given(None, None)
#: An eager run's: Celery's ``apply()`` runs the body inline, under no time limit.
EAGER: Final = AttemptLimits(NO_LIMIT, NO_LIMIT, eager=True)

#: The limits one job was given, as :func:`given` reads them: the hard and soft limits
#: handed to the pool, then what Celery would have applied, each with its source:
#: ``(hard, soft, celery_hard, celery_hard_source, celery_soft, celery_soft_source)``.
Handed = tuple[float | None, float | None, float | None, str | None, float | None, str | None]


def celery_applies(
    message: float | None,
    task: float | None,
    task_source: str,
    worker: float | None,
    worker_source: str | None,
) -> tuple[float | None, str | None]:
    """The limit Celery applies and who set it: the first that is set (Celery's ``or``:
    0 and ``None`` are no limit) of the message's, the task's (``task_source``: its own,
    or the app's that Celery 5.7 copied onto it) and the pool's default (the worker's).
    A message's limit equal to the task's is the task's: Celery's ``apply_async``
    writes the task's limits into every message it publishes."""
    if message:
        return message, task_source if message == task else MESSAGE
    if task:
        return task, task_source
    if worker:
        return worker, worker_source
    return None, None


def _one(seconds: float | None, celery: float | None, source: str | None) -> Given:
    if seconds is None:
        return NO_LIMIT
    if celery is None or seconds < celery:
        return Given(seconds, DEADLINE, celery, source)
    return Given(celery, source)


def given(handed: object) -> AttemptLimits | None:
    """The limits a job was given (:data:`Handed`), as who set each: a limit shorter than
    Celery's own (or where Celery had none) is the deadline's. ``None`` when ``handed``
    is not such a record (it is made from what came with the job's request, whose
    headers anyone may write, and is checked as any of them)."""
    if not isinstance(handed, (tuple, list)) or len(handed) != 6:
        return None
    hard, soft, celery_hard, hard_source, celery_soft, soft_source = cast(Handed, tuple(handed))
    for seconds, source in ((celery_hard, hard_source), (celery_soft, soft_source)):
        if not (seconds is None and source is None) and not (
            _is_limit(seconds) and source in CELERY_SOURCES
        ):
            return None
    if not all(value is None or _is_limit(value) for value in (hard, soft)):
        return None
    return AttemptLimits(_one(hard, celery_hard, hard_source), _one(soft, celery_soft, soft_source))


def _is_limit(value: object) -> bool:
    return type(value) in (int, float) and 0 < value < _LONGEST  # type: ignore[operator]


#: Longer than any limit a worker is given (a century): a record saying more is not one.
_LONGEST: Final = 100 * 366 * 86400.0


# -- the claim's record ----------------------------------------------------------------------


def claim_detail(retries: int, limits: AttemptLimits | None) -> str:
    """The claim event's detail: the message's retries, and the limits its attempt was
    given (``None``: not known to the claim, as before this record existed)."""
    if limits is None:
        return f"retries={retries}"
    if limits.eager:
        return f"retries={retries}; limits: none (eager run)"
    return f"retries={retries}; limits: hard {_said(limits.hard)}, soft {_said(limits.soft)}"


def _said(limit: Given) -> str:
    if limit.seconds is None or limit.source is None:
        return "none"
    said = f"{_number(limit.seconds)} s by {limit.source}"
    if limit.source != DEADLINE:
        return said
    if limit.instead is None or limit.instead_source is None:
        return f"{said} (none)"
    return f"{said} ({limit.instead_source}: {_number(limit.instead)} s)"


def _number(seconds: float) -> str:
    """Seconds to the millisecond, without trailing zeros (a shorter limit whole)."""
    said = f"{seconds:.3f}".rstrip("0").rstrip(".")
    return said if said != "0" else f"{seconds:.3g}"


_NUMBER: Final = r"\d+(?:\.\d+)?(?:e-?\d+)?"
_CELERY: Final = "|".join(sorted(CELERY_SOURCES))


def _limit_pattern(name: str) -> str:
    return (
        rf"(?:none|(?P<{name}>{_NUMBER}) s by (?P<{name}_by>{_CELERY}|{DEADLINE})"
        rf"(?P<{name}_then> \((?:none|(?P<{name}_by2>{_CELERY}): (?P<{name}2>{_NUMBER}) s)\))?)"
    )


_CLAIM: Final = re.compile(
    rf"retries=(?P<retries>\d+)(?P<limits>; limits: (?:(?P<eager>none \(eager run\))"
    rf"|hard {_limit_pattern('hard')}, soft {_limit_pattern('soft')}))?"
)


def read_claim(detail: str) -> AttemptLimits | None:
    """The limits a claim event's ``detail`` recorded (:func:`claim_detail`); ``None``
    when it recorded none (a claim made before this record existed) or is not such a
    detail (a stored row is read as any input: checked, never trusted)."""
    found = _CLAIM.fullmatch(detail)
    if found is None or found["limits"] is None:
        return None
    if found["eager"]:
        return EAGER
    hard, soft = _read(found, "hard"), _read(found, "soft")
    if hard is None or soft is None:
        return None
    return AttemptLimits(hard, soft)


def _read(found: re.Match[str], name: str) -> Given | None:
    """One limit of a matched claim detail; ``None`` if it is not one :func:`_said`
    writes (only the deadline's says what it shortened, and it always does)."""
    seconds = found[name]
    if seconds is None:
        return NO_LIMIT
    source = found[f"{name}_by"]
    if (source == DEADLINE) != (found[f"{name}_then"] is not None):
        return None
    if source != DEADLINE:
        return Given(float(seconds), source)
    instead = found[f"{name}2"]
    return Given(
        float(seconds), DEADLINE, None if instead is None else float(instead), found[f"{name}_by2"]
    )
