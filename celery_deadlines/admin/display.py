"""Pure formatting for the admin: instants, durations, badges, the recorded message.
No queries here; every instant is UTC to the millisecond with a ``Z``."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..explain import utc
from ..rules.outcomes import PERFORMED_PAST_DEADLINE
from ..rules.states import EFFECT_LABELS, STATUS_LABELS, TERMINAL, EffectState, Status

__all__ = [
    "badge",
    "breakable",
    "describe_time_left",
    "dotted",
    "effect_badge",
    "human",
    "message_parts",
    "released_as",
    "resolving_does",
    "short_id",
    "utc",
]

#: A status's badge colour (background): waiting grey, working blue, attention amber
#: or red, done green.
COLOURS = {
    Status.QUEUED: "#6c757d",
    Status.CLOCK_UNCERTAIN: "#b8860b",
    Status.RUNNING: "#0d6efd",
    Status.RETRYING: "#6f42c1",
    Status.UNKNOWN: "#d63384",
    Status.PAUSED: "#fd7e14",
    Status.SUCCEEDED: "#198754",
    Status.FAILED: "#dc3545",
    Status.EXPIRED: "#8b0000",
}

#: The admin's own small stylesheet (no external assets).
STYLE = SafeString(
    "<style>.cdl-badge{display:inline-block;padding:1px 6px;border-radius:8px;color:#fff;"
    "font-size:11px;font-weight:bold;white-space:nowrap}"
    ".cdl-table{width:100%;font-size:12px}.cdl-table td,.cdl-table th{padding:3px 6px}"
    ".cdl-table td{overflow-wrap:break-word}.cdl-table th{white-space:normal}"
    ".cdl-wrap{overflow-wrap:anywhere}"
    ".cdl-effects{font-size:11px}.cdl-effects td,.cdl-effects th{padding:3px 4px}"
    ".cdl-effects td.cdl-mono{white-space:normal;min-width:9em}"
    ".cdl-effects td:last-child{white-space:nowrap}"
    ".cdl-mono{font-family:monospace;white-space:nowrap}"
    ".cdl-traceback{max-height:30em;overflow:auto;white-space:pre-wrap;font-size:11px}"
    ".cdl-warning{background:#fff3cd;border:1px solid #d4a72c;padding:8px 12px}"
    "#result_list thead th,#result_list thead th *{white-space:normal}"
    # ids, keys, reasons and owners wrap only where display.breakable put a <wbr> (after
    # a separator): break-word, unlike anywhere, does not let the table squeeze a
    # column into breaking inside a word (retry_budge|t_exhauste|d)
    "#result_list td.field-short_task_id,#result_list td.field-owner_breakable,"
    "#result_list td.field-status_and_reason,#result_list td.field-key_breakable,"
    "#result_list td.field-run_link,#result_list td.field-evidence_short"
    "{max-width:16em;overflow-wrap:break-word;word-break:normal}"
    "#result_list td.field-task{max-width:14em;overflow-wrap:break-word;word-break:normal}"
    "#result_list td.field-created_and_time_left,#result_list td.field-state_and_updated"
    "{white-space:nowrap}"
    "details.cdl>summary{cursor:pointer;font-weight:bold;padding:6px 0}</style>"
)


def badge(status: str) -> SafeString:
    """The status as a coloured badge, its label as the tooltip."""
    try:
        known = Status(status)
    except ValueError:
        return format_html('<span class="cdl-badge" style="background:#333">{}</span>', status)
    return format_html(
        '<span class="cdl-badge" style="background:{}" title="{}">{}</span>',
        COLOURS[known],
        STATUS_LABELS[known],
        status,
    )


#: An effect state's badge colour: waiting grey, out blue, unknown as a run's UNKNOWN,
#: done green, refused red.
EFFECT_COLOURS = {
    EffectState.INTENT_RECORDED: "#6c757d",
    EffectState.DISPATCHED: "#0d6efd",
    EffectState.UNKNOWN: COLOURS[Status.UNKNOWN],
    EffectState.SUCCEEDED: "#198754",
    EffectState.FAILED: "#dc3545",
    EffectState.NOT_DISPATCHED: "#6c757d",
}


def effect_badge(state: str) -> SafeString:
    """An effect's state as a coloured badge (UNKNOWN as a run's), its label the tooltip."""
    try:
        known = EffectState(state)
    except ValueError:
        return format_html('<span class="cdl-badge" style="background:#333">{}</span>', state)
    return format_html(
        '<span class="cdl-badge" style="background:{}" title="{}">{}</span>',
        EFFECT_COLOURS[known],
        EFFECT_LABELS[known],
        state,
    )


def resolving_does(*, deadline: datetime | None, now: datetime) -> tuple[bool, str]:
    """What resolving an effect of a run with ``deadline`` does now (by the database
    clock ``now``): whether the deadline has passed, and the sentence the resolve form
    shows before the operator submits."""
    if deadline is not None and deadline <= now:
        return True, (
            f"its deadline passed {human((now - deadline).total_seconds())} ago "
            f"({utc(deadline)}): resolving ends the run EXPIRED. Found: the effect is "
            f"recorded as performed and the run ends {PERFORMED_PAST_DEADLINE}; its "
            "result is not replayed (the task does not go on after it), and its caller "
            "is told PerformedPastDeadline. Not found: it ends deadline_passed, nothing "
            "is dispatched again, and its caller is told DeadlineRefused."
        )
    left = (
        "no deadline"
        if deadline is None
        else (
            f"{human((deadline - now).total_seconds())} left until its deadline ({utc(deadline)})"
        )
    )
    return False, (
        f"{left}: resolving queues the run again at once. Found: the effect is recorded as "
        "performed and its result is replayed to the run's next attempt (not called "
        "again). Not found: the next attempt dispatches it again."
    )


def released_as(status: str, reason: str) -> str:
    """What releasing a run after its effects were settled did, in an operator's words."""
    if status == Status.QUEUED:
        return "requeued (its next attempt replays the effect's result, or dispatches it again)"
    if reason == PERFORMED_PAST_DEADLINE:
        return (
            f"expired ({reason}: the effect is recorded as performed, but the deadline had "
            "passed: the task does not go on after it, and its caller is told "
            "PerformedPastDeadline)"
        )
    return (
        f"expired ({reason}: the deadline had passed; nothing is dispatched again, and its "
        "caller is told DeadlineRefused)"
    )


def dotted(name: str) -> SafeString:
    """A dotted name (``shop.tasks.send_confirmation``) that wraps after its dots, not
    inside a word: a word-break opportunity after each dot."""
    parts = name.split(".")
    return format_html_join(SafeString(".<wbr>"), "{}", ((part,) for part in parts))


#: A Celery task id: a UUID, shown by its first 8 hex digits.
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
#: Where an id, a key, a name or an owner may wrap: after these.
_SEPARATORS = re.compile(r"(?<=[.:_@/\-])")


def short_id(task_id: str, length: int = 8, longest: int = 36) -> str:
    """A task id as the list shows it: a UUID (Celery's) by its first ``length``
    characters and an ellipsis, unique in practice (search and ``explain`` take it);
    any other id (a custom one, ``order-42:capture``) whole, up to ``longest``
    characters, else its first ``longest - 1`` and an ellipsis. The whole id is the
    title."""
    if _UUID.fullmatch(task_id):
        return f"{task_id[:length]}…"
    return task_id if len(task_id) <= longest else f"{task_id[: longest - 1]}…"


def breakable(text: str) -> SafeString:
    """``text`` with a word-break opportunity after each ``. : _ @ / -``: a long id,
    key, reason or owner wraps there, never inside a word."""
    return format_html_join(
        SafeString("<wbr>"), "{}", ((part,) for part in _SEPARATORS.split(text))
    )


def human(seconds: float) -> str:
    """``12.3 s``, ``4.5 min`` or ``2.0 h``."""
    size = abs(seconds)
    if size < 120:
        return f"{size:.1f} s"
    if size < 7200:
        return f"{size / 60:.1f} min"
    return f"{size / 3600:.1f} h"


def describe_time_left(
    *,
    deadline: datetime | None,
    status: str,
    now: datetime,
    created_at: datetime | None = None,
    updated_at: datetime | None = None,
) -> str:
    """``12.3 s left``, ``passed 4.0 s ago``, ``no deadline``, or for a run that ended,
    ``ended after 3.2 s`` (from its enqueue to its last write)."""
    if status in TERMINAL:
        if created_at is not None and updated_at is not None:
            return f"ended after {human((updated_at - created_at).total_seconds())}"
        return "ended"
    if deadline is None:
        return "no deadline"
    left = deadline - now
    if left < timedelta(0):
        return f"passed {human(-left.total_seconds())} ago"
    return f"{human(left.total_seconds())} left"


def message_parts(
    body: bytes | memoryview | None, content_type: str, encoding: str
) -> dict[str, Any] | None:
    """The recorded message decoded (``args``, ``kwargs``, ``options``), or ``None``;
    raises ``ValueError`` saying why when it is not decoded here: only serializers that
    build data and that the app accepts are (a page view must never run a pickle)."""
    if body is None:
        return None
    from celery import current_app

    from ..ledger.outbox import decode_message, readable_for_display

    accept = readable_for_display(current_app)
    return decode_message(bytes(body), content_type, encoding, accept=accept)
