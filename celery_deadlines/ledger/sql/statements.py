"""The base of every group of statements (the store's connection and dialect), and
:class:`Sql`: one statement's text, read from its group's file and rendered for each
dialect at import.

Each group's statements are written whole in ``<group>.sql`` beside its module
(``runs.sql`` for :mod:`.runs`), one after another, each under its name and what it does::

    -- renew --
    -- Extend the lease ...
    UPDATE celery_deadlines_run SET lease_expires_at = {lease_end}, ...

A statement that differs between databases is written once for each, under its name and
the dialect's (``-- claim (postgresql) --``, ``-- claim (sqlite) --``); one that only one
dialect runs is written for it alone. Its name in the package (and its golden file's,
``tests/golden/sql/<group>.<name>.<dialect>.sql``) is ``<group>.<name>``.

A statement names in braces what is written once elsewhere, each slot SQL text:

* the dialect's: ``{now}`` (the database clock), ``{now_plus}`` (the clock plus a
  duration parameter, ``%s``; ``{now_plus:reserve}`` takes the named parameter
  ``%(reserve)s``), ``{now_less_grace}`` (the clock less the supervisor's grace),
  ``{lease_end}`` / ``{lease_end:ttl}`` (the clock plus a duration, never past the run's
  deadline), ``{in_values}`` / ``{in_values:ids}`` (in the list of values a parameter
  holds, as :meth:`~.dialect.Dialect.values` gives it: ``WHERE run_id {in_values:ids}``),
  ``{json}`` (a JSON document given as text), ``{lock_rows}`` and ``{run_kept:alias}`` (a
  condition on its own line: the run row ``alias.id`` exists and is kept to the commit,
  for the event a statement writes with that id read from its snapshot; nothing on
  SQLite);
* the sets of states, from :mod:`celery_deadlines.rules.states`: ``{terminal}``,
  ``{claimable}``, ``{waiting}``, ``{requeueable}``, ``{unresolved}``; the rules'
  conditions ``{has_unresolved}`` and ``{expiry_reason}``; ``{eager_run}``, what an eager
  run's end says of itself
  (:mod:`~celery_deadlines.ledger.sql.predicates`).

A comment on a line of its own inside a statement is the reader's, and is not sent.
Everything else is in the statement's text: values are parameters (``%s``, or named
``%(name)s``; a literal ``%`` is written ``%%``), never pasted in. A slot of several lines
is indented as the line of its slot. What is sent is that layout on one line
(:func:`one_line`); the layout is what ``tests/golden/sql/`` holds.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Mapping
from functools import cached_property
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

from .dialect import POSTGRESQL, SQLITE, Dialect
from .predicates import (
    CLAIMABLE_SQL,
    EAGER_RUN_SQL,
    EXPIRY_REASON_SQL,
    HAS_UNRESOLVED,
    REQUEUEABLE_SQL,
    RUN,
    SUPERVISOR_GRACE,
    TERMINAL_SQL,
    UNRESOLVED_SQL,
    WAITING_SQL,
)

if TYPE_CHECKING:
    from .connection import Store

#: The dialects every statement is rendered for.
DIALECTS: Final = (POSTGRESQL, SQLITE)

#: A slot's value: SQL text, or SQL text made from the slot's parameter name (``None``:
#: the positional ``%s``).
Slot = str | Callable[[str | None], str]

_SLOT: Final = re.compile(r"\{(\w+)(?::(\w+))?\}")
#: A statement's heading in its group's file: ``-- name --`` or ``-- name (dialect) --``,
#: then what it does, in comment lines.
_HEADING: Final = re.compile(r"^-- (\w+)(?: \((\w+)\))? --\n(?:--.*\n)*", re.MULTILINE)

#: Every statement made with :class:`Sql`, by name (the golden files' names).
STATEMENTS: dict[str, Sql] = {}


def _param(name: str | None) -> str:
    return "%s" if name is None else f"%({name})s"


def _literal(value: float | str) -> str:
    """A number or a string written as an SQL literal."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(float(value))


def dialect_slots(d: Dialect) -> dict[str, Slot]:
    """The slots every template may name, for the dialect ``d``."""

    def now_plus(name: str | None) -> str:
        return d.now_plus.replace("%s", _param(name))

    def run_kept(alias: str | None) -> str:
        # an event written with a run id from the statement's snapshot must not outlive
        # the run (PostgreSQL does not check the reference: migration 0012)
        if alias is None:
            raise ValueError("{run_kept} names the run row's alias: {run_kept:alias}")
        if not d.key_share:
            return ""
        return f"AND EXISTS (SELECT 1 FROM {RUN} kept WHERE kept.id = {alias}.id{d.key_share})"

    return {
        "now": d.now,
        "now_plus": now_plus,
        # the database clock less the supervisor's grace, the duration written into the
        # statement (a parameter would cost every claim its own)
        "now_less_grace": d.now_plus.replace("%s", _literal(d.seconds(-SUPERVISOR_GRACE))),
        "lease_end": lambda name: d.least(now_plus(name), "deadline"),
        "in_values": lambda name: d.in_values.replace("%s", _param(name)),
        "json": d.json_param,
        "lock_rows": d.lock_rows,
        "run_kept": run_kept,
        "terminal": TERMINAL_SQL,
        "claimable": CLAIMABLE_SQL,
        "waiting": WAITING_SQL,
        "requeueable": REQUEUEABLE_SQL,
        "unresolved": UNRESOLVED_SQL,
        "has_unresolved": HAS_UNRESOLVED,
        "expiry_reason": EXPIRY_REASON_SQL,
        "eager_run": EAGER_RUN_SQL,
    }


def render(template: str, d: Dialect) -> str:
    """``template`` for the dialect ``d``, laid out as written (dedented); an unknown
    slot is a :class:`KeyError` (at import: a statement is rendered once)."""
    slots = dialect_slots(d)

    def value(name: str, param: str | None) -> str:
        slot = slots[name]
        if callable(slot):
            return slot(param)
        return slot

    def fill(line: str) -> str:
        indent = line[: len(line) - len(line.lstrip())]
        return _SLOT.sub(lambda m: value(m[1], m[2]).replace("\n", "\n" + indent), line)

    lines = []
    for line in textwrap.dedent(template).strip("\n").splitlines():
        filled = fill(line)
        if filled.strip() or not line.strip():  # a line of an empty slot goes
            lines.append(filled.rstrip())
    return "\n".join(lines)


def one_line(layout: str) -> str:
    """``layout`` as it is sent: its lines stripped and joined by one space (white space
    inside a line, a literal's included, is left as it is)."""
    return " ".join(stripped for line in layout.splitlines() if (stripped := line.strip()))


class Sql:
    """One statement: its text as written (:attr:`template`), its layout per dialect
    (:attr:`layout`) and the text sent (:attr:`text`), each by ``Dialect.vendor``, both
    rendered once, when it is made. The statements read :attr:`text` with their
    dialect's vendor: nothing is built per call.
    """

    __slots__ = ("layout", "name", "template", "text")

    def __init__(self, name: str, templates: Mapping[str, str]) -> None:
        """``templates``: the statement's text for each dialect it runs on, by vendor."""
        if name in STATEMENTS:
            raise ValueError(f"two statements are named {name}")
        self.name = name
        self.template = dict(templates)
        self.layout = {
            d.vendor: render(templates[d.vendor], d) for d in DIALECTS if d.vendor in templates
        }
        for vendor, layout in self.layout.items():
            # sent on one line, a comment would swallow the rest of the statement
            if "--" in layout:
                raise ValueError(f"statement {name} ({vendor}) holds '--'")
        self.text = {vendor: one_line(layout) for vendor, layout in self.layout.items()}
        STATEMENTS[name] = self


def parse(group: str, source: str) -> dict[str, Sql]:
    """The statements of ``source``, a group's file (see above), by their name in it."""
    parts = _HEADING.split(source)
    templates: dict[str, dict[str, str]] = {}
    # parts: what precedes the first heading, then (name, dialect, text) for each one
    for name, vendor, text in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        vendors = [vendor] if vendor else [d.vendor for d in DIALECTS]
        written = templates.setdefault(name, {})
        for one in vendors:
            if one not in {d.vendor for d in DIALECTS} or one in written:
                raise ValueError(f"{group}.{name}: written twice, or for no dialect ({one})")
            # a comment on a line of its own is the reader's, and is not sent
            kept = (line for line in text.splitlines() if not line.lstrip().startswith("--"))
            written[one] = "\n".join(kept).strip("\n")
    return {name: Sql(f"{group}.{name}", written) for name, written in templates.items()}


def queries(group: str) -> dict[str, Sql]:
    """The statements of the group ``group``, written in ``<group>.sql`` beside this
    module, by name."""
    source = resources.files(__package__).joinpath(f"{group}.sql").read_text(encoding="utf-8")
    return parse(group, source)


class Statements:
    """Statements run on one :class:`~celery_deadlines.ledger.sql.connection.Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @cached_property
    def dialect(self) -> Dialect:
        return self.store.dialect

    def execute(
        self, sql: str, params: list[Any] | dict[str, Any], *, timed: bool = False
    ) -> tuple[int, list[tuple[Any, ...]]]:
        return self.store.execute(sql, params, timed=timed)
