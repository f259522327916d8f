"""The enforcement table of docs/explanation/pools.md ("Every pool and configuration:
what each enforces"), read as the matrix checks it: one row per pool or configuration,
each cell's first word its claim."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from tests.support.processes import REPO

DOC: Final = REPO / "docs" / "explanation" / "pools.md"
HEADING: Final = "# Every pool and configuration: what each enforces"

#: The columns, in order, by the name the checks use.
COLUMNS: Final = (
    "name", "body", "soft", "end", "late_writes", "effect", "call", "remaining", "caller",
)  # fmt: skip

#: The words a cell may begin with, per column.
WORDS: Final = {
    "body": {"stopped", "runs on"},
    "soft": {"yes", "no"},
    "end": {"expired", "running", "none"},
    "late_writes": {"none", "fenced", "unfenced"},
    "effect": {"unreached", "refused"},
    "call": {"unreached", "refused"},
    "remaining": {"unread", "negative"},
}


def rows(path: Path = DOC) -> dict[str, dict[str, str]]:
    """The table's rows by their first cell: each column's claim (its first words, or
    for ``caller`` the first name in backquotes)."""
    text = path.read_text()
    start = text.index(HEADING)
    following = text.find("\n## ", start + len(HEADING))
    section = text[start : following if following != -1 else len(text)]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header, rule, *body = lines
    if len(_cells(header)) != len(COLUMNS) or not set(rule) <= set("|-: "):
        raise ValueError(f"the enforcement table's header changed: {header}")
    table: dict[str, dict[str, str]] = {}
    for line in body:
        cells = _cells(line)
        if len(cells) != len(COLUMNS):
            raise ValueError(f"a row of {len(cells)} cells, not {len(COLUMNS)}: {line}")
        claims = {"name": cells[0]}
        for column, cell in zip(COLUMNS[1:-1], cells[1:-1], strict=True):
            claims[column] = _first_word(column, cell)
        caller = re.match(r"`(\w+)`", cells[-1])
        if caller is None:
            raise ValueError(f"{cells[0]}: the caller's cell must begin with a `name`")
        claims["caller"] = caller.group(1)
        table[cells[0]] = claims
    return table


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _first_word(column: str, cell: str) -> str:
    for word in sorted(WORDS[column], key=len, reverse=True):
        if cell == word or cell.startswith((f"{word}:", f"{word} ")):
            return word
    raise ValueError(f"column {column!r}: {cell!r} begins with none of {sorted(WORDS[column])}")
