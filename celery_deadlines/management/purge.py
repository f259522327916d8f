"""``manage.py deadlines purge [--older-than AGE] [--dry-run] [--batch-size N] [--json]``.

Deletes ended runs older than ``--older-than`` (default: ``CELERY_DEADLINES_RETENTION``
from Django's settings) with their events, effects and plans, in batches of one
transaction each, under the rule of :mod:`celery_deadlines.ledger.sql.retention`.
``--dry-run`` counts what would go (and what is kept for its effects) and writes nothing.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..checks import from_django
from ..conf import MAX_BUDGET, RETENTION
from ..errors import ConfigurationError, InvalidDeadline
from ..ledger.retention import preview, purge
from ..ledger.sql.connection import Store
from ..rules.retention import BATCH_SIZE, describe_age, parse_age, parse_batch_size


def _age(text: str) -> timedelta:
    try:
        return parse_age(text, name="--older-than")
    except InvalidDeadline as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _batch_size(text: str) -> int:
    try:
        return parse_batch_size(text, name="--batch-size")
    except InvalidDeadline as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(actions: Any) -> None:
    """The ``purge`` subcommand's arguments, on the command's subparsers."""
    parser = actions.add_parser(
        "purge", help="delete ended runs older than the retention, with their history"
    )
    parser.add_argument(
        "--older-than",
        type=_age,
        metavar="AGE",
        help="14d, 36h, P2W, PT90M or seconds (default: CELERY_DEADLINES_RETENTION)",
    )
    parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    parser.add_argument(
        "--batch-size", type=_batch_size, default=BATCH_SIZE, help="runs per transaction"
    )
    parser.add_argument("--json", action="store_true", help="the counts as JSON")


def handle(command: BaseCommand, store: Store, options: dict[str, Any]) -> None:
    settings = from_django()
    older_than: timedelta | None = options["older_than"]
    try:
        if older_than is None:
            older_than = settings.get(RETENTION)
            if older_than is None:
                raise CommandError(
                    "CELERY_DEADLINES_RETENTION is off (None or 0): name --older-than "
                    "to purge by hand"
                )
        longest = settings.get(MAX_BUDGET)
    except ConfigurationError as exc:
        raise CommandError(str(exc)) from exc
    if older_than < longest:
        command.stderr.write(
            f"warning: {describe_age(older_than)} is shorter than the longest budget "
            f"({describe_age(longest)}): a run still alive may dispatch again an effect "
            "key whose record this purge deletes"
        )
    dry_run = bool(options["dry_run"])
    if dry_run:
        before, counts = preview(store, older_than)
    else:
        before, counts = purge(store, older_than, batch_size=options["batch_size"])
    if options["json"]:
        facts = {
            "dry_run": dry_run,
            "cutoff": before.isoformat(),
            "older_than_seconds": older_than.total_seconds(),
            **counts.as_dict(),
        }
        command.stdout.write(json.dumps(facts, indent=2))
        return
    what = (
        f"{counts.runs} ended runs ({counts.events} events, {counts.effects} effects, "
        f"{counts.plans} plans) that ended before {before.isoformat(timespec='seconds')} "
        f"(older than {describe_age(older_than)})"
    )
    if not dry_run:
        batches = f"{counts.batches} batch" + ("" if counts.batches == 1 else "es")
        command.stdout.write(f"purged {what} in {batches}")
        return
    command.stdout.write(f"would purge {what}")
    if counts.kept:
        command.stdout.write(
            f"would keep {counts.kept} older ended runs: an effect of theirs could still "
            "be asked for (unresolved, or changed or asked for since the cutoff)"
        )
