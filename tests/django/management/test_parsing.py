"""``manage.py deadlines`` repeats what it was given cut, as ``quoting.shown`` cuts it:
an id it explains, a database alias, and every value argparse refuses or does not know
(argparse repeats them whole: a 100 KB id, 5,000 digits of a batch size)."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.management.commands.deadlines import Command
from celery_deadlines.management.parsing import LONGEST_ERROR
from tests.django.admin.test_runs import record

BIG = "x" * 100_000
#: The longest error the command may write: the parser's bound, its "..." and Django's
#: "Error: " (its own errors are shorter).
LONGEST = LONGEST_ERROR + len("...") + len("Error: ")


def refused(*arguments: str) -> str:
    """The command's error for ``arguments``, checked: short, and no control character."""
    with pytest.raises(CommandError) as error:
        call_command("deadlines", *arguments, stdout=StringIO(), stderr=StringIO())
    said = str(error.value)
    assert len(said) <= LONGEST, said[:LONGEST]
    assert not [character for character in said if not character.isprintable()], said
    return said


def test_explain_repeats_an_id_of_100_kb_cut(alias: str) -> None:
    record(Store(alias), "order-42")  # SQLite refuses the LIKE of such a start, row by row
    said = refused("--database", alias, "explain", BIG)
    assert said.startswith("no run with task id 'xxxxxxxxxx")
    assert said.endswith("..., nor one starting with it")
    escaped = refused("--database", alias, "explain", "\x1b[2J" + "y" * 200)
    assert "'\\x1b[2Jyyyy" in escaped


@pytest.mark.parametrize(
    "arguments",
    [
        ("purge", "--batch-size", "9" * 5000),
        ("purge", "--batch-size=" + "9" * 5000),
        (BIG,),
        ("reconcile", BIG),
        ("reconcile", "--" + BIG),
        ("-v" + "9" * 5000, "reconcile"),
        ("reconcile", "\x1b]0;owned\x07"),
        ("reconcile", *["y"] * 20_000),
    ],
    ids=[
        "batch-size",
        "batch-size=",
        "action",
        "unknown-argument",
        "unknown-option",
        "verbosity",
        "control-characters",
        "20,000-arguments",
    ],
)
def test_a_value_argparse_refuses_is_repeated_cut(arguments: tuple[str, ...]) -> None:
    said = refused(*arguments)
    assert said.startswith("Error: ")
    assert "..." in said or "\\x1b]0;owned\\x07" in said


def test_a_refused_value_on_the_command_line_is_written_cut_to_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        Command().run_from_argv(["manage.py", "deadlines", "purge", "--batch-size", "9" * 5000])
    assert exited.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("manage.py deadlines purge: error: argument --batch-size: ")
    assert "got '999999999" in error
    assert len(error) <= LONGEST + len("manage.py deadlines purge: ")


@pytest.mark.parametrize(
    ("arguments", "settings", "words"),
    [
        (("--database", BIG, "reconcile"), {}, "the database alias 'xxxxxxxxxx"),
        (("reconcile",), {"CELERY_DEADLINES_DATABASE": ["default"]}, "got ['default']"),
        (("explain", "x"), {"CELERY_DEADLINES_DATABASE": BIG}, "alias 'xxxxxxxxxx"),
    ],
    ids=["option", "setting-a-list", "setting-too-long"],
)
def test_a_database_alias_that_names_none_is_refused_cut(
    arguments: tuple[str, ...], settings: dict[str, Any], words: str
) -> None:
    with override_settings(**settings):
        assert words in refused(*arguments)
