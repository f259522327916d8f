"""The base of every group of statements (the store's connection and dialect), and
:class:`Sql`: one statement's text, written once as SQL and rendered for each dialect at
import.

A template is SQL with named slots in braces, each one SQL text:

* the dialect's: ``{now}`` (the database clock), ``{now_plus}`` (the clock plus a
  duration parameter, ``%s``; ``{now_plus:reserve}`` takes the named parameter
  ``%(reserve)s``), ``{lease_end}`` / ``{lease_end:ttl}`` (the clock plus a duration,
  never past the run's deadline), ``{json}`` (a JSON document given as text),
  ``{lock_rows}`` and ``{run_kept:alias}`` (a condition on its own line: the run row
  ``alias.id`` exists and is kept to the commit, for the event a statement writes with
  that id read from its snapshot; nothing on SQLite);
* the tables ``{run}``, ``{event}``, ``{effect}``, ``{plan}``;
* the sets of states, from :mod:`celery_deadlines.rules.states`: ``{terminal}``,
  ``{claimable}``, ``{waiting}``, ``{requeueable}``, ``{unresolved}``; and
  ``{has_unresolved}``, ``{expiry_reason}``, ``{event_columns}``, ``{message_columns}``
  (:mod:`~celery_deadlines.ledger.sql.predicates`);
* a statement's own fragments, given by name to :class:`Sql` (themselves templates).

A fragment of several lines is indented as the line of its slot. What is sent is that
layout on one line (:func:`one_line`); the layout is what ``tests/golden/sql/`` holds.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Collection, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any, Final

from .dialect import POSTGRESQL, SQLITE, Dialect
from .predicates import (
    CLAIMABLE_SQL,
    EFFECT,
    EVENT,
    EVENT_COLUMNS,
    EXPIRY_REASON_SQL,
    HAS_UNRESOLVED,
    MESSAGE_COLUMNS,
    PLAN,
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
#: A statement's own fragment: a template, or one made for the dialect.
Fragment = str | Callable[[Dialect], str]

_SLOT: Final = re.compile(r"\{(\w+)(?::(\w+))?\}")

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
        "json": d.json_param,
        "lock_rows": d.lock_rows,
        "run_kept": run_kept,
        "run": RUN,
        "event": EVENT,
        "effect": EFFECT,
        "plan": PLAN,
        "terminal": TERMINAL_SQL,
        "claimable": CLAIMABLE_SQL,
        "waiting": WAITING_SQL,
        "requeueable": REQUEUEABLE_SQL,
        "unresolved": UNRESOLVED_SQL,
        "has_unresolved": HAS_UNRESOLVED,
        "expiry_reason": EXPIRY_REASON_SQL,
        "event_columns": EVENT_COLUMNS,
        "message_columns": MESSAGE_COLUMNS,
    }


def render(template: str, d: Dialect, fragments: Mapping[str, Fragment] | None = None) -> str:
    """``template`` for the dialect ``d``, laid out as written (dedented); an unknown
    slot is a :class:`KeyError` (at import: a statement is rendered once)."""
    slots = dialect_slots(d)
    own = fragments or {}

    def value(name: str, param: str | None) -> str:
        if name in own:
            fragment = own[name]
            text = fragment(d) if callable(fragment) else fragment
            return render(text, d, own)
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
        if filled.strip() or not line.strip():  # a line of an empty fragment goes
            lines.append(filled.rstrip())
    return "\n".join(lines)


def one_line(layout: str) -> str:
    """``layout`` as it is sent: its lines stripped and joined by one space (white space
    inside a line, a literal's included, is left as it is)."""
    return " ".join(stripped for line in layout.splitlines() if (stripped := line.strip()))


class Sql:
    """One statement: its layout per dialect (:attr:`layout`) and the text sent
    (:attr:`text`, by ``Dialect.vendor``), both rendered once, when it is made. The
    statements read :attr:`text` with their dialect's vendor: nothing is built per call.
    """

    __slots__ = ("layout", "name", "text")

    def __init__(
        self,
        name: str,
        template: str | Mapping[str, str],
        *,
        vendors: Collection[str] = ("postgresql", "sqlite"),
        **fragments: Fragment,
    ) -> None:
        """``template``: one for every dialect of ``vendors``, or one per vendor."""
        if name in STATEMENTS:
            raise ValueError(f"two statements are named {name}")
        # a fragment never hides a slot of the dialect's (it would, inside other fragments)
        if hidden := sorted(set(fragments) & set(dialect_slots(POSTGRESQL))):
            raise ValueError(f"statement {name}: fragments {hidden} are slots of the dialect's")
        self.name = name
        templates = template if not isinstance(template, str) else dict.fromkeys(vendors, template)
        self.layout = {
            d.vendor: render(templates[d.vendor], d, fragments)
            for d in DIALECTS
            if d.vendor in templates
        }
        for vendor, layout in self.layout.items():
            # sent on one line, a comment would swallow the rest of the statement
            if "--" in layout:
                raise ValueError(f"statement {name} ({vendor}) holds '--'")
        self.text = {vendor: one_line(layout) for vendor, layout in self.layout.items()}
        STATEMENTS[name] = self


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
