"""Pure formatting for the admin: instants, durations, badges, the recorded message.
No queries here; every instant is UTC to the millisecond with a ``Z``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..explain import utc
from ..rules.states import STATUS_LABELS, TERMINAL, Status

__all__ = [
    "badge",
    "describe_time_left",
    "dotted",
    "human",
    "message_parts",
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
    "#result_list thead th,#result_list thead th *{white-space:normal}"
    "#result_list td.field-owner,#result_list td.field-reason"
    "{max-width:14em;overflow-wrap:anywhere}"
    "#result_list td.field-task{max-width:14em;overflow-wrap:break-word}"
    "#result_list td.field-created_and_time_left"
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


def dotted(name: str) -> SafeString:
    """A dotted name (``shop.tasks.send_confirmation``) that wraps after its dots, not
    inside a word: a word-break opportunity after each dot."""
    parts = name.split(".")
    return format_html_join(SafeString(".<wbr>"), "{}", ((part,) for part in parts))


def short_id(task_id: str, length: int = 8) -> str:
    """The first characters of a task id (the full id is the link's title)."""
    return task_id if len(task_id) <= length + 1 else f"{task_id[:length]}…"


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
