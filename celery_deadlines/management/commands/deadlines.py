"""``manage.py deadlines explain TASK_ID [--json]`` and ``manage.py deadlines reconcile
[--json]``: text for a person, JSON for a script, both from the same values;
``manage.py deadlines cancel TASK_ID --reason TEXT`` (the run and everything it
started: :func:`celery_deadlines.cancel`); and ``manage.py deadlines purge``
(:mod:`celery_deadlines.management.purge`). What the command was given is repeated
in its errors cut (``quoting.shown``), argparse's own errors included
(:mod:`celery_deadlines.management.parsing`)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from ...checks import from_django
from ...conf import DATABASE
from ...core.cancelling import tell_workers
from ...errors import ConfigurationError
from ...explain import explanation_of, render_text, task_ids_named, to_json, typed_id
from ...explain.text import printable
from ...ledger.operations import cancel_run
from ...ledger.reconcile import reconcile_once
from ...ledger.sql.connection import Store
from ...rules.quoting import named, shown
from .. import purge
from ..parsing import CutEchoes, cut

#: Who a cancel from the command line was made by, unless ``--by`` says.
CANCELLED_BY = "manage.py deadlines cancel"


class Command(BaseCommand):
    help = (
        "Explain a run from the ledger, reconcile the ledger once, cancel a run with "
        "everything it started, or purge ended runs."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        return cut(super().create_parser(prog_name, subcommand, **kwargs))

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database",
            default=None,
            help="the ledger's database alias (default: CELERY_DEADLINES_DATABASE)",
        )
        actions = parser.add_subparsers(dest="action", required=True, parser_class=CutEchoes)
        explain_parser = actions.add_parser("explain", help="answer the operator checklist")
        explain_parser.add_argument(
            "task_id", help="the run's task id, or its start if no other run's begins so"
        )
        explain_parser.add_argument("--json", action="store_true", help="the answers as JSON")
        reconcile_parser = actions.add_parser(
            "reconcile", help="one pass of restart reconciliation and sweeping"
        )
        reconcile_parser.add_argument(
            "--json", action="store_true", help="the ids of each category as JSON"
        )
        cancel_parser = actions.add_parser(
            "cancel", help="cancel a run and everything it started (its deadline pulled in)"
        )
        cancel_parser.add_argument("task_id", help="the run's task id")
        cancel_parser.add_argument(
            "--reason", required=True, help="why: kept in each cancelled run's history"
        )
        cancel_parser.add_argument(
            "--by",
            default=CANCELLED_BY,
            help=f"who: kept with the reason (default: {CANCELLED_BY})",
        )
        purge.add_parser(actions)

    def handle(self, *args: Any, **options: Any) -> None:
        options["database"] = self.alias(options["database"])
        if options["action"] == "purge":
            purge.handle(self, Store(options["database"]), options)
        elif options["action"] == "cancel":
            store = Store(options["database"])
            changed = cancel_run(
                store, options["task_id"], reason=options["reason"], by=options["by"]
            )
            if changed:
                from celery import current_app

                tell_workers(current_app)
            self.stdout.write(
                f"{changed} run(s) cancelled: {printable(options['task_id'])} and what it started"
                if changed
                else f"nothing cancelled: {printable(options['task_id'])} had ended, "
                "with everything it started, or is not in the ledger"
            )
        elif options["action"] == "explain":
            self.explain(options["task_id"], options["database"], as_json=options["json"])
        else:
            self.reconcile(options["database"], as_json=options["json"])

    @staticmethod
    def alias(given: str | None) -> str:
        """The ledger's alias: ``--database``, else the setting (as the system checks
        read it); one ``DATABASES`` does not hold is refused, cut."""
        try:
            alias = from_django().get(DATABASE) if given is None else given
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        if alias not in connections.settings:
            raise CommandError(f"the database alias {shown(alias)} is not in DATABASES")
        return alias

    def explain(self, given: str, using: str, *, as_json: bool) -> None:
        """Explain the run ``given`` names: its task id, or the start of one no other
        run's task id shares (the short id the admin lists); a start several share is
        refused with their ids."""
        most = 5
        found = task_ids_named(given, using, most)
        if not found:
            raise CommandError(f"no run with task id {shown(given)}, nor one starting with it")
        if len(found) > 1:
            ids = ", ".join(named(task_id) for task_id in found[:most])
            more = " and more" if len(found) > most else ""
            raise CommandError(
                f"{shown(given)} is not unique: the task ids of {ids}{more} start with it; "
                "give more of the id"
            )
        task_id = found[0]
        if task_id != typed_id(given):  # said on stderr: stdout stays the answer (--json)
            self.stderr.write(f"run {printable(task_id)} (its task id starts with {shown(given)})")
        explanation = explanation_of(task_id, using)
        if explanation is None:  # purged between the two reads
            raise CommandError(f"no run with task id {shown(task_id)}")
        if as_json:
            self.stdout.write(to_json(explanation))
        else:
            self.stdout.write("\n".join(render_text(explanation)))

    def reconcile(self, using: str, *, as_json: bool) -> None:
        from celery import current_app

        report = reconcile_once(current_app, Store(using))
        if as_json:
            self.stdout.write(json.dumps(report.to_json(), indent=2))
        else:
            self.stdout.write("\n".join(printable(line) for line in report.lines()))
