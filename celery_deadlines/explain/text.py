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

from .shape import Ended, Explanation

#: Between two columns.
GAP = "  "
#: A table: its title, its column headers, its rows.
Section = tuple[str, Sequence[str], Sequence[Sequence[Any]]]


def render_text(f: Explanation) -> list[str]:
    """The checklist for one run, as lines."""
    why = f" ({': '.join(filter(None, (f['reason'], f['detail'])))})" if f["reason"] else ""
    answers: list[tuple[str, str]] = [
        ("status", f"{f['status']}{why}"),
        ("deadline", f["deadline"] or "none"),
        ("delivery deadline", f["delivery_deadline"] or "none"),
        _time(f),
        ("database clock", f["database_clock"]),
        ("next step", f["next_step"]),
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
                    e["detail"],
                )
                for e in f["history"]
            ],
        ),
    ]
    return [printable(line) for line in lines + _sections(sections)]


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


def _ended(ended: Ended) -> str:
    ran = ended["ran_seconds"]
    margin = ended["before_deadline_seconds"]
    parts = [
        "never claimed" if ran is None else f"ran {duration(ran)} from its first claim",
        f"{duration(ended['after_enqueue_seconds'])} after its enqueue",
        "no deadline"
        if margin is None
        else f"{duration(margin)} before its deadline"
        if margin >= 0
        else f"{duration(-margin)} after its deadline",
    ]
    return f"{ended['at']}: {', '.join(parts)}"


def _lease(f: Explanation) -> list[tuple[str, str]]:
    claimed = "-"
    if f["claimed_version"] is not None:
        claimed = f"{f['claimed_version']} (claim at {f['claimed_at']})"
    checkpoint = f["last_checkpoint"]
    next_effect = f["next_effect"]
    token = f["fencing_token"]
    return [
        ("owner now", f["owner"] or "nobody (no live lease)"),
        ("lease expires", f["lease_expires_at"] or "-"),
        ("fencing token", str(token)),
        ("claimed version", claimed),
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


def _refused(f: Explanation) -> str:
    """How many writes were refused, the last three named."""
    rejected = f["stale_writes_refused"]
    if not rejected:
        return "0 refused"
    last = (f"{e['kind']} by {e['owner']} (token {e['token']})" for e in rejected[-3:])
    return f"{len(rejected)} refused: {', '.join(last)}"


def _family(f: Explanation) -> str:
    return (
        f"root {f['root_id'] or '-'}, parent {f['parent_id'] or '-'}, "
        f"{len(f['children'])} child run(s)"
    )


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
