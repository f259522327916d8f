"""The explanation as text for a person: a column of answers, then tables.

Made from the :class:`~celery_deadlines.explain.shape.Explanation` alone (what
``--json`` prints), so the text cannot show a fact the JSON lacks. Column widths are
measured from the values, so a long event kind or owner does not shift the columns
after it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from .shape import Ended, Event, Explanation, Refused, TimeLimits

#: Between two columns.
GAP = "  "
#: A table: its title, its column headers, its rows.
Section = tuple[str, Sequence[str], Sequence[Sequence[Any]]]


def render_text(f: Explanation) -> list[str]:
    """The checklist for one run, as lines."""
    why = f" ({': '.join(filter(None, (f['reason'], f['detail'])))})" if f["reason"] else ""
    answers: list[tuple[str, str]] = [
        ("status", f"{f['status']}{why}"),
        *_cancel(f),
        ("deadline", f["deadline"] or "none"),
        ("delivery deadline", f["delivery_deadline"] or "none"),
        _time(f),
        ("database clock", f["database_clock"]),
        ("next step", f["next_step"]),
        ("started", started(f)),
        ("runtime", runtime(f)),
        ("time limits", limits_text(f["time_limits"])),
        *_lease(f),
        ("family", _family(f)),
    ]
    occurrence = f["occurrence"]
    if occurrence is not None:
        answers.append(
            (
                "occurrence",
                f"{occurrence['schedule']}: {occurrence['local']} {occurrence['zone']} = "
                f"{occurrence['not_before']}, window until {f['deadline'] or '-'}",
            )
        )
    width = max(len(label) for label, _ in answers)
    lines = [f"run {f['task_id']} ({f['task_name']})"]
    lines += [f"  {label:<{width}}{GAP}{_cell(value)}" for label, value in answers]
    sections: list[Section] = [
        (
            "effects",
            ("key", "state", "name", "kind", "token", "dispatches", "error", "evidence"),
            [
                (
                    e["key"],
                    e["state"],
                    e["name"],
                    e["kind"],
                    e["token"],
                    e["dispatches"],
                    e["error"],
                    _json(e["evidence"]),
                )
                for e in f["effects"]
            ],
        ),
        (
            "plans",
            ("plan", "state", "made", "ended", "reason", "detail"),
            [
                (p["plan_id"], p["state"], p["created_at"], p["ended_at"], p["reason"], p["detail"])
                for p in f["plans"]
            ],
        ),
        *_each_attempts_limits(f["time_limits"]),
        (
            "children",
            ("task id", "task", "status", "reason"),
            [(c["task_id"], c["task_name"], c["status"], c["reason"]) for c in f["children"]],
        ),
        (
            "replays, its recorded message published again",
            ("at", "kind", "by", "status", "token", "detail"),
            [
                (r["at"], r["kind"], r["by"], r["status"], r["token"], r["detail"])
                for r in f["replays"]
            ],
        ),
        (
            "history, every compare-and-swap by the database clock",
            ("at", "kind", "outcome", "status", "reason", "version", "token", "owner", "detail"),
            [
                (
                    e["at"],
                    e["kind"],
                    e["outcome"],
                    e["status"],
                    e["reason"],
                    e["version"],
                    e["token"],
                    e["owner"],
                    event_detail(e, f["task_name"]),
                )
                for e in f["history"]
            ],
        ),
    ]
    trace = f["traceback"]
    tail = (
        ["", "  traceback (kept, bounded):", *(f"    {t}" for t in trace.splitlines())]
        if trace
        else []
    )
    return [printable(line) for line in lines + _sections(sections) + tail]


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "    ") -> list[str]:
    """``rows`` under ``header``, each column as wide as its widest cell."""
    cells = [list(header), *([_cell(value) for value in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        (indent + GAP.join(c.ljust(w) for c, w in zip(row, widths, strict=True))).rstrip()
        for row in cells
    ]


def duration(seconds: float) -> str:
    """``0.412 s``, ``12.3 s``, ``640.0 s (10.7 min)``, ``9000 s (2.5 h)``."""
    if seconds < 10:
        return f"{seconds:.3f} s"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds:.1f} s ({seconds / 60:.1f} min)"
    return f"{seconds:.0f} s ({seconds / 3600:.1f} h)"


def _time(f: Explanation) -> tuple[str, str]:
    """An ended run says when it ended and how long it took, never a time left."""
    ended = f["ended"]
    if ended is not None:
        return "ended", _ended(ended)
    left = f["time_left_seconds"]
    if left is None:
        return "time left", "no deadline"
    if left < 0:
        return "time left", f"none: the deadline passed {duration(-left)} ago"
    return "time left", f"{duration(left)} by the database clock"


def started(f: Explanation) -> str:
    """When its first claim started it (a pool process claims right before the body)."""
    at = f["started_at"]
    return "never: never claimed" if at is None else f"{at} (its first claim)"


def runtime(f: Explanation) -> str:
    """How long it ran: its time RUNNING, over its attempts."""
    ran = f["runtime_seconds"]
    if ran is None:
        return "-: never claimed"
    so_far = "" if f["ended"] is not None or f["status"] != "RUNNING" else " so far"
    return f"{duration(ran)}{so_far} (time running over {f['attempts']} attempt(s))"


def limits_text(attempts: Sequence[TimeLimits]) -> str:
    """The time limits the last attempt was given, as its claim recorded them."""
    if not attempts:
        return "none given: never claimed"
    last = attempts[-1]
    which = f"attempt {last['attempt']} of {len(attempts)}" if len(attempts) > 1 else "its attempt"
    return f"{attempt_limits(last)} ({which}, claimed {last['at']})"


def attempt_limits(attempt: TimeLimits) -> str:
    """One attempt's time limits, and who set each."""
    if attempt["eager"]:
        return "none: an eager run (Celery applies no time limit to apply())"
    if not attempt["recorded"]:
        left = attempt["deadline_left_seconds"]
        return "not recorded (claimed before claims recorded them)" + (
            "" if left is None else f"; its deadline was {duration(left)} away at the claim"
        )
    return f"{_given('hard', attempt)}; {_given('soft', attempt)}"


#: Who set a limit, as the text says it, by limit and source.
SET_BY = {
    ("hard", "message"): "the message's own (apply_async's time_limit)",
    ("soft", "message"): "the message's own (apply_async's soft_time_limit)",
    ("hard", "task"): "the task's own time_limit",
    ("soft", "task"): "the task's own soft_time_limit",
    ("hard", "app"): "the app's task_time_limit",
    ("soft", "app"): "the app's task_soft_time_limit",
    ("hard", "worker"): "the worker's --time-limit",
    ("soft", "worker"): "the worker's --soft-time-limit",
}


def _given(kind: str, attempt: TimeLimits) -> str:
    seconds = attempt["hard_seconds" if kind == "hard" else "soft_seconds"]
    by = attempt["hard_set_by" if kind == "hard" else "soft_set_by"]
    if seconds is None or by is None:
        return f"no {kind} limit"
    if by != "deadline":
        return f"{kind} limit {duration(seconds)}, {SET_BY.get((kind, by), by)}"
    celery = attempt["hard_celery_seconds" if kind == "hard" else "soft_celery_seconds"]
    celery_by = attempt["hard_celery_set_by" if kind == "hard" else "soft_celery_set_by"]
    if celery is None or celery_by is None:
        return f"{kind} limit {duration(seconds)}, the deadline's (Celery would have given none)"
    return (
        f"{kind} limit {duration(seconds)}, the deadline's (shorter than "
        f"{SET_BY.get((kind, celery_by), celery_by)}: {duration(celery)})"
    )


def owner_now(f: Explanation) -> str:
    """Who may act on the run now: the owner of a live lease, else nobody (and who
    claimed it last)."""
    if f["owner"]:
        return f["owner"]
    if f["last_owner"]:
        return f"nobody (no live lease; last claimed by {f['last_owner']})"
    return "nobody (no live lease)"


def claimed(f: Explanation) -> str:
    """The version the current claim made, or the last claim's of a run released since."""
    if f["claimed_version"] is None:
        return "never claimed"
    said = f"{f['claimed_version']} (claim at {f['claimed_at']}"
    if f["claimed_token"] != f["fencing_token"]:
        said += f" under token {f['claimed_token']}; released since: token now {f['fencing_token']}"
    return said + ")"


def _ended(ended: Ended) -> str:
    ran = ended["ran_seconds"]
    margin = ended["before_deadline_seconds"]
    parts = [
        "never claimed" if ran is None else f"ran {duration(ran)} (time running)",
        f"{duration(ended['after_enqueue_seconds'])} after its enqueue",
        "no deadline"
        if margin is None
        else f"{duration(margin)} before its deadline"
        if margin >= 0
        else f"{duration(-margin)} after its deadline",
    ]
    return f"{ended['at']}: {', '.join(parts)}"


def _lease(f: Explanation) -> list[tuple[str, str]]:
    checkpoint = f["last_checkpoint"]
    next_effect = f["next_effect"]
    token = f["fencing_token"]
    return [
        ("owner now", owner_now(f)),
        ("lease expires", f["lease_expires_at"] or "-"),
        ("fencing token", str(token)),
        ("claimed version", claimed(f) if f["claimed_version"] is not None else "-"),
        ("version now", str(f["version"])),
        ("attempts", f"{f['attempts']} claim(s), {f['lost_leases']} lease(s) lost"),
        (
            "last checkpoint",
            f"{checkpoint['name']!r} at {checkpoint['at']} under token {checkpoint['token']}: "
            f"{json.dumps(checkpoint['data'])}"
            if checkpoint
            else "none",
        ),
        (
            "old worker guard",
            f"only token {token} may write or dispatch, until {f['lease_expires_at']}"
            if f["lease_live"]
            else "no token may write or dispatch: no live lease",
        ),
        ("stale writes", _refused(f)),
        (
            "next effect",
            f"{next_effect['key']}: {next_effect['state']}" if next_effect else "none pending",
        ),
        (
            "unknown outcomes",
            "; ".join(
                f"{e['key']} ({e['error'] or 'no error recorded'})" for e in f["unknown_effects"]
            )
            or "none",
        ),
    ]


def event_detail(event: Event, task_name: str) -> str:
    """An event's detail as the operator reads it (the run is a run of ``task_name``): a
    message refused for naming another task (stored as ``task_mismatch:<that task>``)
    says which task it named; any other detail as it is stored."""
    why, _, named = event["detail"].partition(":")
    if event["outcome"] != "rejected" or why != "task_mismatch":
        return event["detail"]
    return (
        f"task_mismatch: a message for task {named} carried this run's id; refused "
        f"(this is a run of {task_name}): nothing of the run changed, nothing was stored "
        "for its caller"
    )


def _refused(f: Explanation) -> str:
    """How many writes were refused, the last three named."""
    rejected = f["stale_writes_refused"]
    if not rejected:
        return "0 refused"
    last = (f"{e['kind']} by {e['owner'] or '-'} ({_why_refused(e)})" for e in rejected[-3:])
    return f"{len(rejected)} refused: {', '.join(last)}"


def _why_refused(refused: Refused) -> str:
    """A refused write in a few words: its token, or the task a foreign message named."""
    why, _, named = refused["detail"].partition(":")
    return f"a message for {named}" if why == "task_mismatch" else f"token {refused['token']}"


def _cancel(f: Explanation) -> list[tuple[str, str]]:
    """When, who, why, and what was running at the cancel's instant (none: not cancelled)."""
    c = f["cancelled"]
    if c is None:
        return []
    why = f": {c['reason']}" if c["reason"] else ""
    then = f"it was {c['status_then']}"
    if c["token_then"] is not None:
        then += f" (owner {c['owner_then'] or '-'}, token {c['token_then']})"
    dispatched = ", ".join(c["effects_dispatched_by_then"]) or "none"
    running = ", ".join(c["running_in_its_tree_then"]) or "none"
    return [
        ("cancelled", f"at {c['at']} by {c['by']}{why}"),
        (
            "at the cancel",
            f"{then}; its effects dispatched by then: {dispatched}; "
            f"running in its tree then: {running}",
        ),
    ]


def _family(f: Explanation) -> str:
    return (
        f"root {f['root_id'] or '-'}, parent {f['parent_id'] or '-'}, "
        f"{len(f['children'])} child run(s)"
    )


def _each_attempts_limits(attempts: Sequence[TimeLimits]) -> list[Section]:
    """A run claimed more than once: each attempt's limits (the row above says the
    last one's)."""
    if len(attempts) < 2:
        return []
    return [
        (
            "time limits, each attempt's, as its claim recorded them",
            ("attempt", "claimed", "token", "limits"),
            [(a["attempt"], a["at"], a["token"], attempt_limits(a)) for a in attempts],
        )
    ]


def _sections(sections: Sequence[Section]) -> list[str]:
    """Each ``title (n):`` and its table after a blank line; an empty one as ``title:
    none``, on the line after the empty one before it."""
    lines: list[str] = []
    empty_above = False
    for title, header, rows in sections:
        if rows:
            lines += ["", f"  {title} ({len(rows)}):", *table(header, rows)]
        else:
            lines += [*([] if empty_above else [""]), f"  {title}: none"]
        empty_above = not rows
    return lines


def _cell(value: Any) -> str:
    """One line, ``-`` for nothing: a cell must not break its row."""
    if value is None or value == "":
        return "-"
    return " ".join(str(value).splitlines())


#: What a terminal would act on rather than show: C0 and C1 controls (ESC starts the
#: sequences that move the cursor, recolour or retitle the window), DEL, and the
#: invisible marks that reorder or hide text (bidirectional overrides, zero widths).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def printable(text: str) -> str:
    """``text`` as a terminal may show it: every character in :data:`_UNPRINTABLE`
    written as its Python escape (``\\x1b``, ``\\u202e``). Task ids, effect keys and
    details are written by whoever published or called; the operator reads them."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)
