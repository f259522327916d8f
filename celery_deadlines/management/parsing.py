"""The ``deadlines`` command's parser: Django's, whose errors repeat what they were
given as :func:`~celery_deadlines.rules.quoting.shown` cuts it.

argparse repeats a value it refuses whole, and what it does not know too (``invalid
choice: '<100 KB>'``, ``unrecognized arguments: ...``, ``invalid int value: '<5,000
digits>'``): a script that hands the command an id it read from elsewhere would have
all of it written to stderr, control characters included.
"""

from __future__ import annotations

import sys
from argparse import Namespace
from collections.abc import Iterable, Sequence
from typing import Any, Final

from django.core.management.base import CommandParser

from ..rules.quoting import LIMIT, shown

#: The longest error the parser writes, whatever it repeats: its own words and a value or
#: two, each cut to :data:`~celery_deadlines.rules.quoting.LIMIT` (then ``...``).
LONGEST_ERROR: Final = 300


def cut_echoes(message: str, given: Iterable[str]) -> str:
    """``message`` with every value of ``given`` it repeats (as written, or as ``repr``
    writes it) longer than :data:`~celery_deadlines.rules.quoting.LIMIT` or unprintable
    repeated as ``shown`` cuts it: an argument, an option's value after its ``=``, a
    short option's after its letter (``-v99``). At most :data:`LONGEST_ERROR`
    characters (and ``...``) in all: a thousand short unknown arguments are cut too."""
    values = set()
    for argument in given:
        values.add(argument)
        values.add(argument.partition("=")[2])
        if argument[:1] == "-" and argument[1:2] != "-":
            values.add(argument[2:])
    for value in sorted(values, key=len, reverse=True):  # a value's part after it
        if len(value) <= LIMIT and value.isprintable():
            continue  # repeated as it is
        said = shown(value)
        message = message.replace(repr(value), said).replace(value, said)
    return message if len(message) <= LONGEST_ERROR else f"{message[:LONGEST_ERROR]}..."


class CutEchoes(CommandParser):
    """Django's parser (an error raises ``CommandError``, or exits from the command
    line), its errors' echoes cut (:func:`cut_echoes`)."""

    given: tuple[str, ...] = ()

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Namespace | None = None
    ) -> tuple[Namespace, list[str]]:
        self.given = tuple(str(argument) for argument in (sys.argv[1:] if args is None else args))
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> Any:
        return super().error(cut_echoes(message, self.given))


def cut(parser: Any) -> CutEchoes:
    """``parser`` (Django's, as ``BaseCommand.create_parser`` made it) as a
    :class:`CutEchoes`: the same object, its errors cut from now on."""
    parser.__class__ = CutEchoes
    return parser  # type: ignore[no-any-return]
